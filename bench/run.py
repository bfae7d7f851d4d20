"""Run every bench/*.py script in turn, each in its own process (each prints its figure and
ratio). Exits non-zero if any benchmark crashed."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run.py" and not p.name.startswith("_"))
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
