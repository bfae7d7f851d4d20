"""Run every bench/*.py script in turn (each prints its figure and ratio)."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    sys.path.insert(0, str(HERE.parent))
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run.py" and not p.name.startswith("_"))
    if not scripts:
        print("no benchmarks yet")
        return 0
    for script in scripts:
        print(f"== {script.name}")
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
