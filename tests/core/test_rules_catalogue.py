"""The documentation stays whole as the code moves:

- docs/rules.md has a row for every rule id (``R-SESS-1``, ``R-LAUNCH``) and every SPEC section
  that the code, the tests, the benchmarks, the client, the settings, the templates or the scripts
  cite, and every test it names exists;
- docs/architecture.md's app map names every app of INSTALLED_APPS that lives under apps/;
- every relative link in README.md, docs/ and the READMEs of tests/ and bench/ reaches a file
  (and, with a #fragment into a Markdown file, one of its headings), and every repository path
  they name in backquotes exists."""

import ast
import re
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "rules.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CITING = ["apps", "tests", "bench", "client", "config", "templates", "scripts", ".ci"]
RULE_ID = re.compile(r"\bR-[A-Z]+(?:-\d+)?\b")
SPEC_SECTION = re.compile(r"SPEC ?§ ?(\d+[a-z]?)")
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _cited_texts():
    for folder in CITING:
        for path in sorted((ROOT / folder).rglob("*")):
            wanted = path.suffix in {".py", ".md", ".html", ".txt", ".sh"} or path.name == "run"
            if path.is_file() and wanted and "__pycache__" not in path.parts:
                yield path, path.read_text(errors="replace")


def cited_rule_ids() -> dict[str, str]:
    """{rule id: the first file citing it}."""
    cited = {}
    for path, text in _cited_texts():
        for rule in RULE_ID.findall(text):
            cited.setdefault(rule, str(path.relative_to(ROOT)))
    return cited


def cited_spec_sections() -> dict[str, str]:
    cited = {}
    for path, text in _cited_texts():
        for section in SPEC_SECTION.findall(text):
            cited.setdefault(section, str(path.relative_to(ROOT)))
    return cited


def catalogue_rows() -> dict[str, str]:
    """{rule id or "SPEC §n": the rest of its table row}."""
    rows = {}
    for line in RULES.read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and (RULE_ID.fullmatch(cells[1]) or SPEC_SECTION.fullmatch(cells[1])):
            rows[cells[1].replace("SPEC§", "SPEC §")] = "|".join(cells[2:])
    return rows


def test_the_catalogue_reads_rows_of_both_kinds():
    rows = catalogue_rows()
    assert "R-SESS-1" in rows and "SPEC §7b" in rows and "R-LAUNCH" in rows


def test_every_rule_id_cited_in_the_code_or_tests_is_in_the_catalogue():
    rows = catalogue_rows()
    missing = {rule: where for rule, where in cited_rule_ids().items() if rule not in rows}
    assert not missing, f"rule ids cited without a row in docs/rules.md (id: first file citing it): {missing}"


def test_every_spec_section_cited_is_in_the_catalogue():
    rows = catalogue_rows()
    missing = {s: where for s, where in cited_spec_sections().items() if f"SPEC §{s}" not in rows}
    assert not missing, f"SPEC sections cited without a row in docs/rules.md: {missing}"


def test_every_rule_names_a_test_or_says_what_it_lands_with():
    bare = [rule for rule, rest in catalogue_rows().items() if "::" not in rest and "(lands with" not in rest]
    assert not bare, f"rows of docs/rules.md that name no test: {bare}"


def test_every_test_the_catalogue_names_exists():
    defined = {}
    unknown = []
    for file, name in TEST_REFERENCE.findall(RULES.read_text()):
        path = ROOT / file
        if file not in defined:
            defined[file] = (
                {
                    node.name
                    for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
                if path.is_file()
                else set()
            )
        if name not in defined[file]:
            unknown.append(f"{file}::{name}")
    assert not unknown, f"docs/rules.md names tests that do not exist: {unknown}"


# -- the app map -----------------------------------------------------------------------------------


def test_the_app_map_names_every_installed_app_under_apps():
    text = ARCHITECTURE.read_text()
    ours = [app for app in settings.INSTALLED_APPS if app.startswith("apps.")]
    assert ours, "no app under apps/ in INSTALLED_APPS?"
    missing = [app for app in ours if not re.search(rf"^\s*{re.escape(app.replace('.', '/'))}/", text, re.MULTILINE)]
    assert not missing, f"apps in INSTALLED_APPS without a line in docs/architecture.md's app map: {missing}"


# -- links -----------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "tests" / "README.md", ROOT / "bench" / "README.md"]
    found += sorted((ROOT / "docs").rglob("*.md"))
    return [path for path in found if path.is_file()]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated one suffixed -1, -2, …"""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for document in documents():
        text = FENCE.sub("", document.read_text())
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z]+:", target) or target.startswith("//"):
                continue  # https:, mailto: …: not checked here
            file_part, _, fragment = target.partition("#")
            path = (document.parent / file_part).resolve() if file_part else document
            where = f"{document.relative_to(ROOT)}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and path.suffix == ".md" and fragment not in anchors(path):
                broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


REPOSITORY_PATH = re.compile(r"`((?:apps|config|tests|bench|scripts|client|templates|static|examples)/[\w./-]*)`")


def test_every_repository_path_the_docs_name_exists():
    """A file or folder named in backquotes (`apps/sessions/statements.py`) is still there: a
    move or a rename updates the docs that send readers to it."""
    gone = []
    for document in documents():
        for path in REPOSITORY_PATH.findall(document.read_text()):
            if not (ROOT / path.rstrip("/")).exists():
                gone.append(f"{document.relative_to(ROOT)}: {path}")
    assert not gone, "the docs name paths that do not exist:\n" + "\n".join(gone)


def test_the_readme_links_every_doc_and_stays_a_front_page():
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not unlinked, f"docs the README does not link: {unlinked}"
    assert len(readme) <= 8000, f"the README is {len(readme)} characters: the manual belongs in docs/"
    first_block = re.search(r"```sh\n(.*?)```", readme, re.DOTALL).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert readme.split("\n", 1)[1].lstrip().startswith("```sh"), "the README starts with its two commands"
    assert commands == ["make run", "make test"]


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+")


def test_code_tests_and_benchmarks_cite_no_issue_numbers():
    """Comments say what and why, not which issue asked for it (commit messages carry those); a
    bug of an upstream project may still be named as such."""
    cited = []
    for folder in ["apps", "tests", "bench", "client", "scripts", "config", "templates", ".ci"]:
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in {".png", ".pyc", ".json"}:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if ISSUE_NUMBER.search(line) and "upstream" not in line:
                    cited.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for number, line in enumerate((ROOT / "Makefile").read_text().splitlines(), 1):
        if ISSUE_NUMBER.search(line):
            cited.append(f"Makefile:{number}: {line.strip()}")
    assert not cited, "issue numbers in the code:\n" + "\n".join(cited)
