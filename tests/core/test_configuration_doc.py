"""docs/configuration.md against the code: every environment variable the configuration reads
(``config/settings.py`` through ``config/env.py``'s readers, ``config/gunicorn.conf.py``) has a
row there, and every variable a row names is read somewhere in the repository."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
#: Where a documented variable may be read: the code, its tests and tools, the Makefile and CI.
SOURCES = ["apps", "config", "client", "scripts", "tests", "bench", "Makefile", ".ci/run"]


def _name_of_read(node: ast.AST) -> str | None:
    """The variable a call or subscript reads: ``env_int("X", …)``, ``os.environ.get("X")``,
    ``os.environ["X"]`` (read, not assigned) or ``gunicorn_errors.limit("X", …)``."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        environ_get = (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "environ"
        )
        if name.startswith("env_") or name == "limit" or environ_get:
            return node.args[0].value if isinstance(node.args[0].value, str) else None
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "environ"
        and isinstance(node.slice, ast.Constant)
    ):
        return node.slice.value
    return None


def variables_read_by_the_configuration() -> set[str]:
    names = set()
    for path in sorted((ROOT / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = _name_of_read(node)
            if name:
                names.add(name)
    return names


def documented_variables() -> set[str]:
    """The backquoted names in the first cell of every table row of the page."""
    names = set()
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        names.update(re.findall(r"`([A-Z][A-Z0-9_]*\*?)`", first_cell))
    return names


def repository_text() -> str:
    chunks = []
    for source in SOURCES:
        path = ROOT / source
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if file.suffix in {".py", ".sh", ".toml", ".cfg", ".txt", ""} and "__pycache__" not in file.parts:
                try:
                    chunks.append(file.read_text())
                except UnicodeDecodeError:
                    continue
    return "\n".join(chunks)


def test_the_reader_finds_the_variables_of_every_kind_of_read():
    read = variables_read_by_the_configuration()
    # one of each: env_str, env_int, env_database's own reads, gunicorn's os.environ.get, limit()
    assert {"SECRET_KEY", "GRIDGATE_Q_WORKERS", "CONN_MAX_AGE", "GRIDGATE_WEB_WORKERS"} <= read
    assert "GRIDGATE_WEB_LIMIT_REQUEST_LINE" in read
    assert len(read) > 90


def test_every_variable_the_configuration_reads_is_documented():
    missing = variables_read_by_the_configuration() - documented_variables()
    assert not missing, f"read by config/ but without a row in docs/configuration.md: {sorted(missing)}"


def test_every_documented_variable_is_read_somewhere():
    text = repository_text()
    unknown = []
    for name in sorted(documented_variables()):
        if name.endswith("*"):
            found = re.search(rf"\b{re.escape(name[:-1])}[A-Z0-9_]", text)
        else:
            found = re.search(rf"\b{re.escape(name)}\b", text)
        if not found:
            unknown.append(name)
    assert not unknown, f"documented in docs/configuration.md but read nowhere: {unknown}"
