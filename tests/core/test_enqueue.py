"""One enqueue helper: every task goes through ``apps.core.tasks.enqueue`` (after commit, broker
errors logged, never raised into a request)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_nothing_but_enqueue_calls_async_task():
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "apps").rglob("*.py")
        if "async_task" in path.read_text() and path != ROOT / "apps/core/tasks.py"
    ]
    assert offenders == []
