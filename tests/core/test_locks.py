"""Row locks lock what they name: ``select_for_update()`` on a query with ``select_related``
locks every joined row (PostgreSQL's FOR UPDATE without OF), so a lock meant for a case or a
connection also held its class, pool or user, and everything that inserts a row naming them
waited. Each such lock names its own rows with ``of=("self",)`` (the tests that prove it on
PostgreSQL: tests/cases, tests/scheduling, tests/backends ``..._never_its_...``)."""

import ast
from pathlib import Path

APPS = Path(__file__).resolve().parents[2] / "apps"


def chain(node: ast.AST) -> list[ast.Call]:
    """The calls of one method chain (``a.b(...).c(...).d(...)``), outermost first."""
    calls = []
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        calls.append(node)
        node = node.func.value
    return calls


def test_a_row_lock_on_a_joined_query_names_its_own_rows():
    offenders, seen = set(), set()
    for path in APPS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            calls = chain(node)
            names = {call.func.attr: call for call in calls}
            if "select_for_update" in names and "select_related" in names:
                where = f"{path.relative_to(APPS)}:{names['select_for_update'].lineno}"
                seen.add(where)
                if not any(keyword.arg == "of" for keyword in names["select_for_update"].keywords):
                    offenders.add(where)
    assert len(seen) >= 4 and not offenders, sorted(offenders)
