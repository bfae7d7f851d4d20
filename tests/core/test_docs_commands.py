"""The documentation's commands and endpoints exist as written, checked without a database:

- every `METHOD /path` that README.md, client/README.md and docs/*.md name resolves in the URLconf
  to a view that takes that method (a path without `/api/`, `/qrmi/` or `/metrics` is one of the
  API's, under `/api/v1/`, as api.md writes them), except the providers' own APIs the docs quote;
- every `manage.py <command> --flag` names a command and a flag it has;
- every `gridgate <command> … --option` names a command of the CLI (client/) and an option of
  that command (the `gridgate` command's own `--url`, `--json` and `--version` go before it)."""

import functools
import re
from pathlib import Path

import click
import pytest
from django.core.management import get_commands, load_command_class
from django.urls import Resolver404, resolve

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "client" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

METHOD = r"(?:GET|POST|PUT|PATCH|DELETE)"
ENDPOINT = re.compile(rf"({METHOD}(?:\s*(?:,|/|and|or)\s*{METHOD})*)[ `]+(/[A-Za-z0-9_./<>{{}}:$?=&*, -]*)")
#: Paths of the providers' APIs the docs quote (FirecREST, Run:AI), not Gridgate's; a Pasqal QPU's
#: `/jobs…` and `/system…` have no trailing slash, which Gridgate's `/jobs/{id}/` always has.
FOREIGN = ("/compute/", "/status/", "/api/v1/workloads", "/api/v1/clusters")
SAMPLE_UUID = "123e4567-e89b-12d3-a456-426614174000"


def lines():
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield f"{path.relative_to(ROOT)}:{number}", line


def _sample(path: str) -> str:
    """A concrete URL for a documented path: placeholders become an id."""
    path = re.sub(r"\{path\}", "a.txt", path)
    path = re.sub(r"\{[^}]*\}?|<[^>]*>|\$[A-Z_]+", "1", path)  # {id}, {pool id}, <id>, $JOB
    path = re.split(r"[?\s]", path, maxsplit=1)[0].rstrip(".,:;")
    if not path.startswith(("/api/", "/qrmi/", "/metrics")):
        path = "/api/v1" + path
    return path


def _foreign(path: str) -> bool:
    return path.startswith(FOREIGN) or (path.startswith(("/jobs", "/system")) and not path.endswith("/"))


def documented_endpoints(numbered_lines):
    for where, line in numbered_lines:
        for methods, path in ENDPOINT.findall(line):
            path = re.sub(r"\{[^}]*\}?", lambda m: m.group(0).replace(" ", "_"), path)  # {pool id}
            path = re.split(r"[?\s]", path, maxsplit=1)[0]
            for method in re.findall(METHOD, methods):
                if not _foreign(path):
                    yield where, method, path


def _takes(match, method: str) -> bool:
    actions = getattr(match.func, "actions", None)
    if actions is not None:  # a viewset's route: its method → action map
        return method.lower() in actions
    view = getattr(match.func, "cls", None) or getattr(match.func, "view_class", None)
    return view is None or hasattr(view, method.lower())  # a plain function view takes what it says


def test_the_reader_finds_the_endpoints_of_every_form():
    found = {(method, path) for _, method, path in documented_endpoints(lines())}
    assert ("POST", "/api/v1/auth/token/") in found  # inline, method and path in one code span
    assert ("DELETE", "/resource-pools/{id}/") in found  # a table's PUT/PATCH/DELETE `…`
    assert ("GET", "/resource-pools/{id}/classes/") in found  # a table's GET, POST `…`
    assert len(found) > 80


@functools.cache
def _route(url: str):
    for candidate in (url, url.replace("/1/", f"/{SAMPLE_UUID}/")):  # sessions and cases: uuids
        try:
            return resolve(candidate)
        except Resolver404:
            pass
    return None


def endpoint_complaints(numbered_lines) -> list[str]:
    wrong = []
    for where, method, path in documented_endpoints(numbered_lines):
        match = _route(_sample(path))
        if match is None:
            wrong.append(f"{where}: {method} {path}: no such route")
        elif not _takes(match, method):
            wrong.append(f"{where}: {method} {path}: the route does not take {method}")
    return wrong


def test_every_documented_endpoint_exists_with_its_method():
    assert not (wrong := endpoint_complaints(lines())), "\n".join(wrong)


def test_the_endpoint_check_catches_a_wrong_route_or_method():
    assert endpoint_complaints([("doc:1", "| GET, DELETE `/health/` | anyone |")]) == [
        "doc:1: DELETE /health/: the route does not take DELETE"
    ]
    assert endpoint_complaints([("doc:1", "`POST /api/v1/sessions/{id}/close/`")]) == [
        "doc:1: POST /api/v1/sessions/{id}/close/: no such route"
    ]
    assert endpoint_complaints([("doc:1", "`GET /jobs/{uid}` of the QPU, `GET /qrmi/<pool>/qpu-slots`")]) == []


@functools.cache
def _flags_of_manage_py(name: str) -> frozenset[str]:
    parser = load_command_class(get_commands()[name], name).create_parser("manage.py", name)
    return frozenset(option for action in parser._actions for option in action.option_strings)


def manage_py_complaints(numbered_lines) -> list[str]:
    commands = get_commands()
    invocation = re.compile(r"manage\.py ([a-z_]+)((?: +(?:-[-a-z0-9]+|<[^>]+>|\[[^]]*\]|[\w./=:…-]+))*)")
    wrong = []
    for where, line in numbered_lines:
        for name, rest in invocation.findall(line):
            if name not in commands:
                wrong.append(f"{where}: manage.py {name}: no such command")
                continue
            flags = _flags_of_manage_py(name)
            for flag in re.findall(r"(?<![\w-])--?[a-z][-a-z0-9]*", rest):
                if flag not in flags:
                    wrong.append(f"{where}: manage.py {name} {flag}: no such flag")
    return wrong


def test_every_documented_manage_py_command_and_flag_exists():
    assert not (wrong := manage_py_complaints(lines())), "\n".join(wrong)


def test_the_manage_py_check_catches_a_wrong_command_or_flag():
    assert manage_py_complaints([("doc:1", "manage.py doctor --pool 3 --frob")]) == [
        "doc:1: manage.py doctor --frob: no such flag"
    ]
    assert manage_py_complaints([("doc:1", "`manage.py frob`")]) == ["doc:1: manage.py frob: no such command"]


def _cli_tree() -> dict[tuple[str, ...], tuple[click.Command, set[str]]]:
    from gridgate_client.cli import cli

    tree = {}

    def walk(command, path):
        options = {option for param in command.params for option in (*param.opts, *param.secondary_opts)}
        tree[path] = (command, {option for option in options if option.startswith("-")})
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(cli, ())
    return tree


def gridgate_complaints(numbered_lines) -> tuple[int, list[str]]:
    """(how many invocations were read, what is wrong with them)."""
    tree = _cli_tree()
    top = {path[0] for path in tree if path}
    invocation = re.compile(
        r"\bgridgate((?: +--?[a-z][-a-z]*(?: +https?://\S+)?)*)((?: +[a-z][a-z-]*)+)"
        r"((?: +(?:\"[^\"]*\"|'[^']*'|[^\s`|;&)#]+))*)"
    )
    wrong, seen = [], 0
    for where, line in numbered_lines:
        for before, words, rest in invocation.findall(line):
            words = words.split()
            if words[0] not in top:
                continue  # prose ("the gridgate command")
            path = ()
            for word in words:
                if (*path, word) not in tree:
                    break
                path = (*path, word)
            command, options = tree[path]
            seen += 1
            if isinstance(command, click.Group):
                wrong.append(f"{where}: gridgate {' '.join(words)}: no such command")
                continue
            root_options = tree[()][1]
            for flag in re.findall(r"--?[a-z][-a-z]*", before):
                if flag not in root_options:
                    wrong.append(f"{where}: gridgate {flag} (before the command): no such option")
            for flag in re.findall(r"(?<![\w-])--?[a-zA-Z][-a-z0-9]*", rest):
                if flag not in options:
                    wrong.append(f"{where}: gridgate {' '.join(path)} {flag}: no such option")
    return seen, wrong


def test_every_documented_gridgate_command_and_option_exists():
    seen, wrong = gridgate_complaints(lines())
    assert seen > 30, f"the reader found only {seen} gridgate commands in the docs"
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("gridgate login --url https://x.org", "gridgate login --url: no such option"),
        ("gridgate case frobnicate X", "gridgate case frobnicate: no such command"),
        ("gridgate --verbose pools", "gridgate --verbose (before the command): no such option"),
    ],
)
def test_the_cli_check_catches_a_wrong_option_or_command(line, complaint):
    assert gridgate_complaints([("doc:1", line)]) == (1, [f"doc:1: {complaint}"])
    assert gridgate_complaints([("doc:1", "gridgate --url https://x.org login -u alice")]) == (1, [])
