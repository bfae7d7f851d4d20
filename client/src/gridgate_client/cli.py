"""``gridgate``: Gridgate from a terminal, a batch script or a notebook's shell.

Every command takes ``--json`` (one JSON document on stdout, for scripts); without it the output
is for people. Progress bars and status lines go to stderr, and only when stderr is a terminal.
Errors print the server's own words (its ``detail``) on stderr. The exit status says what
happened (docs/client.md):

====  ==========================================================================
0     done: the command did what it was asked (a waited job completed, a case is done)
1     the work failed (a job or case failed)
2     usage error (a missing or wrong option)
3     refused by the server (400, 403, 404, 409, 413: the message says why)
4     not logged in, or the token is no longer valid (401)
5     the server cannot be reached, is unavailable (5xx) or asks to wait (429), after the retries
6     the work was cancelled
124   a wait timed out (as ``timeout(1)``)
130   interrupted by Ctrl-C (the job or case goes on); 143: by SIGTERM
====  ==========================================================================
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import sys
import tarfile
import tempfile
import time
import traceback
import zlib
from pathlib import Path

import click
import httpx

from gridgate_client import config, devicegrant
from gridgate_client.api import Client, GridgateError, TimedOut

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_AUTH, EXIT_UNAVAILABLE, EXIT_CANCELLED = 0, 1, 2, 3, 4, 5, 6
EXIT_TIMEOUT = 124
OUTCOME = {
    "completed": EXIT_OK,
    "done": EXIT_OK,
    "failed": EXIT_FAILED,
    "unknown": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
}


def exit_for(error: GridgateError) -> int:
    # 429: not a refusal of the request but of its moment (throttled, a login locked out for a
    # while): a script should try again later, as after a 503.
    if error.status is None or error.status >= 500 or error.status == 429:
        return EXIT_UNAVAILABLE
    if error.status == 401:
        return EXIT_AUTH
    return EXIT_REFUSED


class Fail(click.ClickException):
    """An outcome with its own exit status (the message is already the server's or ours)."""

    def __init__(self, message: str, code: int, body: dict | None = None):
        super().__init__(message)
        self.exit_code = code
        self.body = body

    def show(self, file=None):
        say(f"gridgate: {self.message}", err=True)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT), or SIGTERM (a batch job at its time limit, a ``kill``), stopping a command:
    raised where Python would raise KeyboardInterrupt, so every ``finally`` runs (a download's
    partial file is removed, a session opened for one job is closed); ``what`` says what goes on
    on the server. The exit status is 128 + the signal's number, as a shell's: 130, 143."""

    def __init__(self, what: str = "", signum: int = signal.SIGINT):
        super().__init__(what)
        self.what = what
        self.signum = signum


def _terminated(signum, frame):
    raise Interrupted(signum=signum)


class Group(click.Group):
    """Maps the client's exceptions to messages and exit statuses, once for every command."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # caught here, click's own handling would say "Aborted!"
            signum = getattr(exc, "signum", signal.SIGINT)
            what = getattr(exc, "what", "")
            said = ("interrupted" if signum == signal.SIGINT else "terminated") + (f": {what}" if what else "")
            _json_error(ctx, said, None, None)
            raise Fail(said, 128 + signum) from None
        except GridgateError as exc:
            hint = ""
            if exc.status == 401 and os.environ.get("GRIDGATE_TOKEN"):
                # logging in again changes nothing: the environment's token wins over the stored one
                hint = " (the token in GRIDGATE_TOKEN: set a valid one, or unset it to use gridgate login's)"
            elif exc.status == 401 and "gridgate login" not in exc.detail:
                hint = " (log in again: gridgate login)"
            _json_error(ctx, exc.detail, exc.status, exc.body)
            raise Fail(exc.detail + hint, exit_for(exc)) from None
        except TimedOut as exc:
            _json_error(ctx, str(exc), None, exc.last)
            raise Fail(f"timed out: {exc}", EXIT_TIMEOUT) from None
        except config.BadURL as exc:
            _json_error(ctx, str(exc), None, None)
            raise Fail(str(exc), EXIT_USAGE) from None
        except (KeyError, TypeError, IndexError, AttributeError, ValueError) as exc:  # an answer of another shape
            # (or a defect of this client's: where it was raised is said, for its report)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = (
                f"the server's answer is not what this client reads ({type(exc).__name__}: {exc}, "
                f"at {Path(where.filename).name}:{where.lineno})"
            )
            _json_error(ctx, detail, None, None)
            raise Fail(
                f"{detail}: is the URL Gridgate's, and this client as new as the server?", EXIT_UNAVAILABLE
            ) from None


def _json_error(ctx, detail, status, body) -> None:
    obj = ctx.find_root().obj or {}
    if obj.get("json"):
        click.echo(json.dumps({"error": detail, "status": status, "body": body or {}}, default=str))


def json_option(command):
    """``--json`` on every command (also accepted before the command: ``gridgate --json pools``)."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts.")
    @functools.wraps(command)
    def wrapper(*args, as_json=False, **kwargs):
        root = click.get_current_context().find_root()
        root.obj = root.obj or {}
        root.obj["json"] = root.obj.get("json") or as_json
        return command(*args, **kwargs)

    return wrapper


#: what a terminal would obey rather than show: C0 and C1 controls (ESC starts the sequences that
#: retitle a window, write the clipboard (OSC 52), hide or rewrite what was printed) and the bidi
#: overrides that reorder a line. Text from the server (its errors, names, a provider's words, file
#: names a command chose) is shown with these escaped; the logs a user asks for stay as written.
HIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text) -> str:
    """``text`` with every character of :data:`HIDDEN` written as its escape (``\\x1b``)."""

    def escape(match: re.Match) -> str:
        char = match.group()
        if char in _NAMED_ESCAPES:
            return _NAMED_ESCAPES[char]
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"

    return HIDDEN.sub(escape, str(text))


def say(text="", **kwargs) -> None:
    """One line for people (stdout, or stderr with ``err=True``), shown as :func:`printable`."""
    click.echo(printable(text), **kwargs)


def wants_json() -> bool:
    return bool((click.get_current_context().find_root().obj or {}).get("json"))


def emit(data, human=None) -> None:
    if wants_json():
        click.echo(json.dumps(data, indent=2, default=str))
    elif human is not None:
        human(data) if callable(human) else say(human)


def on_terminal() -> bool:
    return sys.stderr.isatty()


def client() -> Client:
    obj = click.get_current_context().find_root().obj or {}
    url = config.resolve_url(obj.get("url"))
    token = config.resolve_token(url)
    if not token:
        twin = config.plain_http_twin(url)
        if twin:
            raise Fail(
                f"not logged in to {url}: the token stored for this site is {twin}'s, over plain http (a login "
                f"that named the site without a scheme, which now means https). Run gridgate --url {url} login, "
                f"or pass --url {twin} if the site serves only http.",
                EXIT_AUTH,
            )
        raise Fail(f"not logged in to {url}: run gridgate login (or set GRIDGATE_TOKEN).", EXIT_AUTH)
    _refresh_if_due(url)
    api = Client(url, config.resolve_token(url))
    api.on_retry = retrying
    return api


def retrying(text: str) -> None:
    """A retry said on stderr (a terminal's status line cleared first), in a batch job's log too:
    a command quiet for minutes while it tries again must not look hung."""
    clear = "\r\033[K" if on_terminal() else ""
    click.echo(clear + "gridgate: " + printable(text), err=True)
    if Status.shown is not None:
        Status.shown.last = ""  # drawn again below the notice at the next poll


def _refresh_if_due(url: str) -> None:
    """A device login's access token is short-lived: renew it from its refresh token when due."""
    if os.environ.get("GRIDGATE_TOKEN"):
        return
    entry = config._read().get("servers", {}).get(url, {})
    if not entry.get("refresh_token") or entry.get("expires_at", 0) > time.time() + 30:
        return
    with httpx.Client(timeout=30) as http:
        tokens = devicegrant.refresh(entry, http=http)
    kept = {key: value for key, value in entry.items() if key != "token"}  # its endpoints, client id
    kept.update(
        refresh_token=tokens.get("refresh_token", entry["refresh_token"]),  # the provider may rotate it
        expires_at=time.time() + float(tokens.get("expires_in", 300)),
    )
    config.store_token(url, tokens["access_token"], **kept)


class Status:
    """A one-line status on stderr while waiting, rewritten in place; nothing when piped."""

    #: the status line being shown, if any (a retry's notice clears it: it is drawn again after)
    shown: Status | None = None

    def __init__(self):
        self.active = on_terminal() and not wants_json()
        self.last = ""
        if self.active:
            Status.shown = self

    def __call__(self, text: str) -> None:
        if self.active and text != self.last:
            click.echo("\r\033[K" + printable(text), nl=False, err=True)
            self.last = text

    def done(self) -> None:
        if self.active and self.last:
            click.echo("", err=True)
        if Status.shown is self:
            Status.shown = None


class Bar:
    """Byte progress on stderr (uploads, downloads), only on a terminal: a bar when the total is
    known, else the bytes so far on one line (a case's archive is streamed as it is made, with no
    length: a bar would sit at 0% until it jumped to 100%)."""

    def __init__(self, total: int | None, label: str):
        self.active = on_terminal() and not wants_json()
        self.label = printable(label)  # a file's name, from the server or a listing
        self.bar = None
        self.done_bytes = 0
        self.counted_at = None  # when the bytes-so-far line was last drawn
        if self.active and total:
            self._open(total)

    def _open(self, total: int) -> None:
        self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=False)
        self.bar.__enter__()

    def add(self, n: int) -> None:
        self.done_bytes += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.active and (self.counted_at is None or time.monotonic() - self.counted_at >= 0.2):
            self.counted_at = time.monotonic()
            click.echo(f"\r\033[K{self.label}: {size_words(self.done_bytes)}", nl=False, err=True)

    def to(self, done: int, total: int | None) -> None:
        if self.active and self.bar is None and self.counted_at is None and total:
            self._open(total)  # the total is known from the answer (its Content-Length)
        self.add(done - self.done_bytes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
        elif self.counted_at is not None:
            click.echo(f"\r\033[K{self.label}: {size_words(self.done_bytes)}", err=True)


def size_words(size: float) -> str:
    """``size`` bytes for people: ``812 B``, ``4.2 MiB``."""
    unit = "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"


def _job_words(job: dict) -> str:
    words = f"job {job['id']}: {job['status']}"
    if job["status"] == "pending" and job.get("pending_reason"):
        words += f" ({job['pending_reason']}"
        if job.get("queue_position"):
            words += f", #{job['queue_position']}"
        if job.get("eta_seconds") is not None:
            words += f", starts in ~{round(job['eta_seconds'])} s"
        words += ")"
    if job.get("error"):
        words += f": {job['error']}"
    return words


def _case_words(case: dict) -> str:
    words = f"case {case['id']} ({case['name']}): {case['status']}"
    if case["status"] == "prepared" and case.get("launch_requested_at"):
        words += " (submitting)"
    if case.get("progress") is not None and case["status"] in ("running", "done"):
        words += f" {round(100 * float(case['progress']))}%"
    if case.get("status_message"):
        words += f" — {case['status_message']}"
    if case.get("last_error"):
        words += f": {case['last_error']}"
    return words


def _finish(obj: dict, words: str) -> None:
    """Print the final object and exit with what happened to it."""
    emit(obj, words)
    code = OUTCOME.get(obj["status"], EXIT_OK)
    if code:
        raise SystemExit(code)


# -- the commands ------------------------------------------------------------------------------
@click.group(cls=Group)
@click.option("--url", envvar="GRIDGATE_URL", help="The Gridgate site (default: GRIDGATE_URL, then the last login).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts.")
@click.version_option(config.VERSION, prog_name="gridgate")
@click.pass_context
def cli(ctx, url, as_json):
    """Gridgate from a terminal: pools, sessions, Pulser jobs and cases."""
    ctx.obj = {"url": url, "json": as_json}


@cli.command()
@click.option("-u", "--username", help="Log in with a password for a personal token.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--device", is_flag=True, help="Sign in in a browser with the centre's provider (RFC 8628).")
@click.option("--name", default="", help="What the token is for (shown on the API tokens page).")
@json_option
def login(username, password_stdin, device, name):
    """Log in and keep the token (0600, under your config directory) for later commands."""
    url = config.resolve_url((click.get_current_context().find_root().obj or {}).get("url"))
    with Client(url, token="") as anonymous:
        try:
            methods = anonymous.login_methods()
        except GridgateError as exc:
            if exc.status != 404:
                raise
            methods = {"password": True, "device": None}  # a server from before login methods
        use_device = device or (not username and not password_stdin and methods.get("device"))
        if use_device:
            if not methods.get("device"):
                raise Fail(f"{url} offers no sign-in from a terminal with its provider: use --username.", EXIT_REFUSED)
            status = Status()

            def show(uri, code, complete):
                say(f"Open {complete or uri} in a browser and enter the code {code}", err=True)
                status("waiting for the sign-in…")

            with httpx.Client(timeout=30) as http:
                tokens = devicegrant.device_login(methods["device"], http=http, show=show)
            status.done()
            path = config.store_token(
                url,
                tokens["access_token"],
                refresh_token=tokens.get("refresh_token"),
                token_endpoint=tokens["token_endpoint"],
                client_id=tokens["client_id"],
                revocation_endpoint=tokens.get("revocation_endpoint"),
                expires_at=time.time() + float(tokens.get("expires_in", 300)),
            )
            emit({"url": url, "method": "device", "stored": str(path)}, f"Logged in to {url} (token in {path}).")
            return
        if not methods.get("password", True):
            raise Fail(f"{url} takes no passwords: run gridgate login --device.", EXIT_REFUSED)
        username = username or click.prompt("Username", err=True)
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:  # not sent: an empty password would count against the lock-out
                raise click.UsageError("--password-stdin read no password (standard input is empty)")
        else:
            password = click.prompt("Password", hide_input=True, err=True)
        answer = anonymous.password_login(username, password, name=name or f"gridgate CLI on {socket.gethostname()}")
    path = config.store_token(url, answer["token"], expires_at_text=answer.get("expires_at"), token_id=answer.get("id"))
    emit(
        {
            "url": url,
            "method": "password",
            "username": username,
            "expires_at": answer.get("expires_at"),
            "stored": str(path),
        },
        f"Logged in to {url} as {username}"
        + (f" until {answer['expires_at']}" if answer.get("expires_at") else "")
        + f" (token in {path}).",
    )


@cli.command()
@json_option
def logout():
    """Revoke the stored token on the server, or a sign-in with the centre's provider there, and
    forget it. A token from an older login (which did not record its id) is only forgotten here."""
    url = config.resolve_url((click.get_current_context().find_root().obj or {}).get("url"))
    entry = config.forget_token(url)
    token_id = (entry or {}).get("token_id")
    if entry is None:
        emit({"url": url, "forgotten": False, "revoked": False}, f"No stored token for {url}.")
        return
    if entry.get("refresh_token"):
        _end_device_login(url, entry)
        return
    if not isinstance(token_id, int):
        emit(
            {"url": url, "forgotten": True, "revoked": False},
            f"Forgot the stored token for {url}; it stays valid until it expires (revoke it on the web pages' "
            "API tokens page).",
        )
        return
    try:
        with Client(url, entry["token"]) as api:
            api.on_retry = retrying
            api.revoke_token(token_id)
    except GridgateError as exc:
        if exc.status not in (401, 404):  # 401/404: the token was already revoked or expired
            raise Fail(
                f"Forgot the stored token for {url}, but could not revoke it there ({exc.detail}): revoke it on "
                "the web pages' API tokens page.",
                exit_for(exc),
            ) from None
    emit({"url": url, "forgotten": True, "revoked": True}, f"Logged out of {url}: the token is revoked.")


def _end_device_login(url: str, entry: dict) -> None:
    """A sign-in with the centre's provider holds its refresh token, which would go on minting
    access tokens: revoked at the provider where it says how (its access token, minutes long, is
    not revocable there: it expires)."""
    try:
        with httpx.Client(timeout=30) as http:
            revoked = devicegrant.revoke(entry, http=http)
    except GridgateError as exc:
        raise Fail(
            f"Forgot the sign-in for {url}, but could not end it at the identity provider ({exc.detail}): it ends "
            "when its refresh token expires.",
            EXIT_UNAVAILABLE,
        ) from None
    if revoked:
        emit(
            {"url": url, "forgotten": True, "revoked": True},
            f"Logged out of {url}: the sign-in is ended at the identity provider.",
        )
    else:
        emit(
            {"url": url, "forgotten": True, "revoked": False},
            f"Forgot the sign-in for {url}; the identity provider did not revoke it, so it ends when its refresh "
            "token expires.",
        )


@cli.command()
@json_option
def pools():
    """Pools you can see: usable by you first, and why not for the others."""
    with client() as api:
        rows = sorted(api.pools(), key=lambda pool: (not pool.get("usable", True), pool["name"]))

    def human(rows):
        if not rows:
            say("No pool is open to you yet.")
        for pool in rows:
            runs = {"jobs": "QPU/jobs", "cases": "cases"}.get(pool.get("runs", ""), "nothing yet")
            usable = "usable by you" if pool.get("usable", True) else f"NOT usable by you: {pool['unusable_reason']}"
            classes = ", ".join(
                f"{klass['name']}{'*' if klass.get('default') else ''}" for klass in pool.get("classes", [])
            )
            say(f"{pool['name']:<16} {pool['kind']:<10} {runs:<10} {usable}")
            if classes:
                say(f"{'':<16} classes: {classes}")

    emit(rows, human)


def _amount(value, unit: str) -> str:
    if value is None:
        return "unlimited"
    if unit == "s":
        return f"{value / 3600:.1f} h" if abs(value) >= 3600 else f"{value / 60:.0f} min"
    return f"{value:.1f} core-h"


@cli.command()
@json_option
def allocations():
    """Your projects' allocations: what is left this period of device time and core-hours."""
    with client() as api:
        rows = api.allocations()

    def human(rows):
        if not rows:
            say("No allocation: your work on every pool is not limited.")
        for row in rows:
            project = f"group {row['group']}" if row.get("group") else f"user {row.get('user')}"
            say(f"{row['name']:<20} {row['pool']:<12} {project}")
            for key, unit, label in (("device_seconds", "s", "device time"), ("core_hours", "h", "case time")):
                granted = row["granted"][key]
                if granted is not None:
                    left = _amount(row["remaining"][key], unit)
                    say(f"{'':<20} {label}: {left} of {_amount(granted, unit)} left this period")
            if row.get("period_end"):
                say(f"{'':<20} period ends {row['period_end']}")

    emit(rows, human)


# -- sessions ----------------------------------------------------------------------------------
@cli.group(cls=Group)
def session():
    """Open, list and close sessions (claims on a pool's slots)."""


@session.command("open")
@click.argument("pool")
@click.option("--class", "class_name", help="A class of the pool (default: its default class).")
@click.option("--slots", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--external-id", help="A scheduler job id: the same id gives back the same session.")
@json_option
def session_open(pool, class_name, slots, external_id):
    """Open a session on POOL (a name or an id)."""
    with client() as api:
        found = api.pool(pool)
        klass = api.class_of(found, class_name)
        opened = api.open_session(resource_class=klass["id"], slots=slots, external_id=external_id)
    # The id alone on stdout, as documented, so that SESSION=$(gridgate session open qpu) is the
    # id; what was opened is said on stderr for the person reading.
    emit(opened, lambda s: (say(s["id"]), say(f"{found['name']}/{klass['name']}: {s['slots']} slot(s)", err=True)))


@session.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also ended sessions.")
@json_option
def session_list(show_all):
    """Your sessions (active ones unless --all)."""
    with client() as api:
        rows = api.sessions(status=None if show_all else "active")
        # A session names its pool and class by id: the pools you can see name them (one request,
        # for people only); one on a pool you may no longer see keeps its id.
        places = {} if wants_json() or not rows else class_places(api.pools())

    def human(rows):
        for s in rows:
            where = places.get(s["resource_class"]) or f"pool {s['pool']}"
            if s["status"] == "active":
                when = f"expires {s['expires_at']}"
            else:
                when = f"ended {s.get('revoked_at')} ({s.get('revocation_reason') or 'ended'})"
            say(f"{s['id']}  {where}  {s['slots']} slot(s)  {s['status']}  {when}")

    emit(rows, human)


def class_places(pools) -> dict:
    """``{class id: "pool/class"}`` of ``pools`` (the API's, each with its classes)."""
    return {klass["id"]: f"{pool['name']}/{klass['name']}" for pool in pools for klass in pool.get("classes") or []}


@session.command("close")
@click.argument("session_id")
@json_option
def session_close(session_id):
    """Release a session: its slots go back to the pool, its waiting jobs are cancelled."""
    with client() as api:
        api.close_session(session_id)
        closed = api.session(session_id)
    emit(closed, f"Session {session_id}: {closed['status']} ({closed.get('revocation_reason') or 'released'}).")


# -- jobs --------------------------------------------------------------------------------------
def read_sequence(path: Path) -> tuple[dict, int | None]:
    """A job file: ``{"payload": {...}, "shots": N}`` (examples/*.json), or a bare Pulser abstract
    representation (``seq.to_abstract_repr()`` saved to a file)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise Fail(f"cannot read {path}: {exc}", EXIT_USAGE) from None
    if isinstance(document, dict) and isinstance(document.get("payload"), dict):
        shots = document.get("shots")
        return document["payload"], shots if isinstance(shots, int) else None
    if isinstance(document, dict) and "register" in document and "operations" in document:
        return {"sequence": document}, None
    raise Fail(f"{path} is neither a job file ({{'payload', 'shots'}}) nor a Pulser sequence.", EXIT_USAGE)


def wait_job(api: Client, job_id, timeout) -> dict:
    status = Status()
    try:
        return api.wait_job(job_id, timeout=timeout, on_poll=lambda job: status(_job_words(job)))
    except KeyboardInterrupt as exc:  # only the wait stops: the job is the server's
        what = f"job {job_id} goes on (gridgate job wait {job_id} waits again, gridgate job cancel {job_id} stops it)"
        raise Interrupted(what, getattr(exc, "signum", signal.SIGINT)) from None
    finally:
        status.done()


@cli.group(cls=Group)
def job():
    """Submit Pulser jobs and follow them."""


@job.command("submit")
@click.argument("sequence_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--session", "session_id", help="An open session of yours to submit in.")
@click.option("--pool", help="No session yet: open one on this pool (closed after --wait).")
@click.option("--class", "class_name", help="With --pool: the class (default: the pool's default class).")
@click.option("--shots", type=click.IntRange(min=1), help="Shots (default: the file's).")
@click.option("--device", type=int, help="A device id of the pool (default: any online device).")
@click.option("--wait", "wait", is_flag=True, help="Wait until it ends; exit status says how.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@json_option
def job_submit(sequence_file, session_id, pool, class_name, shots, device, wait, timeout):
    """Submit SEQUENCE_FILE (a job file or a Pulser abstract representation)."""
    payload, file_shots = read_sequence(sequence_file)
    shots = shots or file_shots
    if not shots:
        raise click.UsageError("give --shots (the file names none)")
    if not session_id and not pool:
        raise click.UsageError("give --session ID, or --pool NAME to open a session for this job")
    with client() as api:
        opened = None
        if not session_id:
            found = api.pool(pool)
            opened = api.open_session(resource_class=api.class_of(found, class_name)["id"])
            session_id = opened["id"]
        try:
            submitted = api.submit_job(session_id, payload, shots, device)
            if not wait:
                extra = f" in new session {session_id} (close it with: gridgate session close {session_id})"
                emit(submitted, f"Job {submitted['id']} submitted with {shots} shots{extra if opened else ''}.")
                return
            try:
                final = wait_job(api, submitted["id"], timeout)
            except Interrupted as exc:
                if opened:  # closed below: its job ends with it
                    exc.what = f"job {submitted['id']} cancelled, with the session opened for it"
                raise
        finally:
            if opened and wait:
                api.close_session(session_id)
    _finish(final, _job_words(final))


@job.command("status")
@click.argument("job_id", type=int)
@json_option
def job_status(job_id):
    """A job's status, why it waits, its queue position and expected start."""
    with client() as api:
        found = api.job(job_id)
    emit(found, _job_words(found))


@job.command("wait")
@click.argument("job_id", type=int)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
@json_option
def job_wait(job_id, timeout):
    """Wait until a job ends: exit 0 completed, 1 failed, 6 cancelled, 124 timed out."""
    with client() as api:
        final = wait_job(api, job_id, timeout)
    _finish(final, _job_words(final))


@job.command("result")
@click.argument("job_id", type=int)
@click.option("--csv", "as_csv", is_flag=True, help="bitstring,count,probability rows.")
@json_option
def job_result(job_id, as_csv):
    """A completed job's counts (409, exit 3, while it has none)."""
    with client() as api:
        if as_csv and not wants_json():
            click.echo(api.job_result_csv(job_id), nl=False)
            return
        result = api.job_result(job_id)

    def human(result):
        for bits, count in result["counts"].items():
            say(f"{bits}  {count}")

    emit(result, human)


@job.command("cancel")
@click.argument("job_id", type=int)
@json_option
def job_cancel(job_id):
    """Cancel a pending job now, or ask a running one to stop."""
    with client() as api:
        found = api.cancel_job(job_id)
    emit(found, _job_words(found) + (" (cancel requested)" if found["status"] == "running" else ""))


@job.command("list")
@click.option("--status", type=click.Choice(["pending", "running", "completed", "failed", "cancelled"]))
@click.option("--session", "session_id", help="One session's jobs.")
@json_option
def job_list(status, session_id):
    """Your jobs, newest first."""
    with client() as api:
        rows = api.jobs(status=status, session=session_id)

    def human(rows):
        for found in rows:
            say(_job_words(found))

    emit(rows, human)


# -- cases -------------------------------------------------------------------------------------
def wait_case(api: Client, case_id, timeout) -> dict:
    status = Status()
    try:
        return api.wait_case(case_id, timeout=timeout, on_poll=lambda case: status(_case_words(case)))
    except KeyboardInterrupt as exc:  # only the wait stops: the case is the server's
        raise Interrupted(_case_goes_on(case_id), getattr(exc, "signum", signal.SIGINT)) from None
    finally:
        status.done()


def _case_goes_on(case_id) -> str:
    return f"case {case_id} goes on (gridgate case wait {case_id} waits again, gridgate case cancel {case_id} stops it)"


def parse_options(pairs) -> dict:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--option takes KEY=VALUE, not {pair!r}")
        options[key] = value
    return options


@cli.group(cls=Group)
def case():
    """Create, launch and follow cases (commands run on a pool's backend)."""


@case.command("create")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--pool", required=True, help="A pool that runs cases (gridgate pools).")
@click.option("--class", "class_name", help="A class of the pool (default: its default class).")
@click.option("--command", "command", required=True, help="The shell command, run in the case directory.")
@click.option("--name", help="The case's name (default: the directory's name).")
@click.option("--watch", multiple=True, help="A file pattern brought back while it runs (repeatable).")
@click.option("--option", "options", multiple=True, help="A launch option KEY=VALUE (repeatable).")
@click.option("--launch", is_flag=True, help="Launch it at once.")
@click.option("--wait", "wait", is_flag=True, help="Launch and wait until it ends; exit status says how.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@json_option
def case_create(directory, pool, class_name, command, name, watch, options, launch, wait, timeout):
    """Create a case whose inputs are the files of DIRECTORY (not its subdirectories)."""
    inputs = sorted(path for path in directory.iterdir() if path.is_file() and not path.name.startswith("."))
    launch_options = parse_options(options)
    with client() as api:
        found = api.pool(pool)
        if not found.get("usable", True):
            # The server refuses it too, at launch: say it before uploading anything.
            raise Fail(f"pool {found['name']!r} is not usable by you: {found['unusable_reason']}", EXIT_REFUSED)
        klass = api.class_of(found, class_name)
        bar = Bar(sum(path.stat().st_size for path in inputs), "uploading")
        try:
            created = api.create_case(
                resource_class=klass["id"],
                name=name or directory.resolve().name,
                command=command,
                inputs=inputs,
                observability_globs=list(watch),
                progress=bar.add,
            )
        finally:
            bar.close()
        if not (launch or wait):
            emit(created, f"{created['id']}  created with {len(inputs)} input file(s); launch: gridgate case launch …")
            return
        launched = api.launch_case(created["id"], launch_options or None)
        if not wait:
            emit(launched, f"{launched['id']}  launched: a worker submits it (gridgate case wait {launched['id']}).")
            return
        final = wait_case(api, launched["id"], timeout)
    _finish(final, _case_words(final))


@case.command("launch")
@click.argument("case_id")
@click.option("--option", "options", multiple=True, help="A launch option KEY=VALUE (repeatable).")
@click.option("--wait", "wait", is_flag=True, help="Wait until it ends; exit status says how.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@json_option
def case_launch(case_id, options, wait, timeout):
    """Launch a prepared case."""
    with client() as api:
        launched = api.launch_case(case_id, parse_options(options) or None)
        if not wait:
            emit(launched, _case_words(launched))
            return
        final = wait_case(api, case_id, timeout)
    _finish(final, _case_words(final))


@case.command("status")
@click.argument("case_id")
@json_option
def case_status(case_id):
    """A case's status, provider note, progress and last error."""
    with client() as api:
        found = api.case(case_id)
    emit(found, _case_words(found))


@case.command("wait")
@click.argument("case_id")
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
@json_option
def case_wait(case_id, timeout):
    """Wait until a case ends: exit 0 done, 1 failed, 6 cancelled, 124 timed out."""
    with client() as api:
        final = wait_case(api, case_id, timeout)
    _finish(final, _case_words(final))


@case.command("logs")
@click.argument("case_id")
@click.option("-f", "--follow", is_flag=True, help="Follow the log until the case ends.")
@click.option("--stderr", "use_stderr", is_flag=True, help="The command's stderr instead of its stdout.")
@click.option("--tail", type=click.IntRange(min=0, max=10000), default=200, show_default=True)
@click.option("--timeout", type=float, help="With -f: give up after this many seconds (exit 124).")
@json_option
def case_logs(case_id, follow, use_stderr, tail, timeout):
    """The tail of a case's log, or (-f) all of it as it grows, to the end of the case."""
    stream = "stderr" if use_stderr else "stdout"
    with client() as api:
        if not follow:
            text = api.case_logs(case_id, stream, tail)
            emit({"case": case_id, "stream": stream, "text": text}, lambda _: click.echo(text, nl=False))
            return
        chunks = []
        try:
            for chunk in api.follow_logs(case_id, stream, timeout=timeout):
                if wants_json():
                    chunks.append(chunk)
                else:
                    click.echo(chunk, nl=False)
        except KeyboardInterrupt as exc:
            raise Interrupted(_case_goes_on(case_id), getattr(exc, "signum", signal.SIGINT)) from None
        final = api.case(case_id)
    if wants_json():
        click.echo(json.dumps({"case": case_id, "stream": stream, "text": "".join(chunks), "status": final["status"]}))
    code = OUTCOME.get(final["status"], EXIT_OK)
    if code:
        raise SystemExit(code)


@case.command("ls")
@click.argument("case_id")
@json_option
def case_ls(case_id):
    """A case's files (inputs, live, results, logs) with their sizes."""
    with client() as api:
        rows = api.case_files(case_id)

    def human(rows):
        for entry in rows:
            say(f"{entry['size']:>12}  {entry['path']}")

    emit(rows, human)


@case.command("get")
@click.argument("case_id")
@click.argument("paths", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every file, as one archive unpacked into -o.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), help="Directory (default: .).")
@click.option("--force", is_flag=True, help="Replace files that are already under -o (default: refuse).")
@json_option
def case_get(case_id, paths, everything, output, force):
    """Download PATHS of a case (e.g. results/out.txt), or --all of them."""
    if not paths and not everything:
        raise click.UsageError("name the files to get, or --all")
    output = output or Path(".")
    # A name from the server's listing (``case ls --json | jq``) or typed: checked before anything
    # is asked, so ``../../.bashrc`` or ``/home/me/.profile`` is never written (nor fetched), and
    # a file already there is not replaced unless asked (--force).
    targets = {}
    for path in paths:
        targets[path] = inside(output, path)
        if targets[path] is None:
            raise click.UsageError(f"{path!r} leads out of {output}/: name a case file, such as results/out.txt")
    if not force:
        refuse_existing(output, [local_name(path) for path in paths])
    written = []
    with client() as api:
        if everything:
            if not force and output.is_dir() and any(output.iterdir()):
                # Before the archive is fetched (it may be large): what the listing names.
                refuse_existing(output, [local_name(entry["path"]) for entry in api.case_files(case_id)])
            written = get_archive(api, case_id, output, force)
        for path in paths:
            dest = targets[path]
            bar = Bar(None, path)
            try:
                api.download_case_file(case_id, path, dest, progress=bar.to)
            except OSError as exc:  # a directory where the file goes, no room, no permission
                raise Fail(f"cannot write {output / local_name(path)}: {exc.strerror or exc}", EXIT_FAILED) from None
            finally:
                bar.close()
            written.append(str(output / local_name(path)))
    emit({"case": case_id, "written": written}, f"{len(written)} file(s) written under {output}/.")


def refuse_existing(output: Path, relatives: list[str]) -> None:
    """A usage error (exit 2) naming the files of ``relatives`` already under ``output``."""
    there = [relative for relative in relatives if os.path.lexists(output / relative)]
    if there:
        shown = ", ".join(there[:3]) + (f" and {len(there) - 3} more" if len(there) > 3 else "")
        raise Fail(f"{len(there)} file(s) already under {output}/ ({shown}): pass --force to replace them", EXIT_USAGE)


def get_archive(api: Client, case_id: str, output: Path, force: bool) -> list[str]:
    """``case get --all``: the archive, fetched beside the files it holds (under ``output``, on
    the file system the user chose for them: not in a shared /tmp, which a large case would
    fill), checked whole, then unpacked; the archive itself is removed whatever happens."""
    made = not output.exists()
    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".gridgate-", dir=output) as scratch:
            archive = Path(scratch) / "case.tar.gz"
            bar = Bar(None, "downloading")
            try:
                api.download_case_archive(case_id, archive, progress=bar.to)
            finally:
                bar.close()
            return unpack(archive, output, force=force)
    except OSError as exc:  # no room for it, no permission
        raise Fail(f"cannot write under {output}/: {exc.strerror or exc}", EXIT_FAILED) from None
    finally:
        if made:
            with contextlib.suppress(OSError):
                output.rmdir()  # only if nothing was written in it


ON_WINDOWS = os.name == "nt"
#: names Windows opens as a device in any directory, with any extension (``NUL``, ``com1.txt``)
WINDOWS_DEVICES = {"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"} | {
    f"{port}{n}" for port in ("COM", "LPT") for n in "123456789\u00b9\u00b2\u00b3"
}


def local_name(relative: str) -> str:
    """The name a case file gets on this disk: the server's, with each control character and bidi
    override (:data:`HIDDEN`) written as ``_``, as the server's own downloads name it. A command
    may name its files as it likes; a file named with an escape sequence or a newline would
    drive the terminal of whoever lists the directory later, or break their scripts."""
    return HIDDEN.sub("_", relative)


def inside(output: Path, relative: str) -> Path | None:
    """Where the case file ``relative`` goes under ``output`` (named :func:`local_name`), or None
    when it would land elsewhere: an empty name, a NUL, an absolute path or a drive (``C:``, on
    Windows), a ``..``, or a link already under ``output`` that leads out; on Windows also a
    device name (``CON``, ``nul.txt``) or a ``:`` (another file's NTFS stream). Names come from
    the server (a listing, an archive): never let them choose where a file lands."""
    if not relative or "\x00" in relative:
        return None
    pure = Path(local_name(relative))  # this system's rules: on Windows a backslash and a drive count too
    if pure.is_absolute() or pure.drive or pure.root or ".." in pure.parts:
        return None
    if ON_WINDOWS and any(
        ":" in part or part.split(".", 1)[0].rstrip(" ").upper() in WINDOWS_DEVICES for part in pure.parts
    ):
        return None
    base = output.resolve()
    target = (base / pure).resolve()
    return target if target.is_relative_to(base) and target != base else None


def unpack(archive: Path, output: Path, *, force: bool = False) -> list[str]:
    """The archive's regular files (``<case id>/<path>``) as ``output/<path>``. Written by hand,
    not ``extractall``: links, devices and modes in the archive are ignored. The whole archive
    is read and checked first, so that nothing is written from one that is broken or refused:
    each member's path must stay under ``output`` (:func:`inside`), name no file already there
    (unless ``force``), and be given once (not twice, nor as a file and as a directory), and
    what it unpacks to must fit in the space free under ``output``. Each
    file is then written through a hidden file beside it, renamed once whole: what stops the
    unpacking (a full disk, Ctrl-C) leaves no half file."""
    planned: dict[Path, tarfile.TarInfo] = {}
    shown: dict[Path, str] = {}
    written: list[str] = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:  # reads the archive to its end: one cut short is found here
                if not member.isfile():
                    continue
                _, _, relative = member.name.partition("/")
                target = inside(output, relative)
                if target is None:
                    raise Fail(f"refusing archive member {member.name!r}: it leads out of {output}", EXIT_FAILED)
                if target in planned:
                    raise Fail(f"refusing the archive: it holds {relative!r} twice", EXIT_FAILED)
                planned[target], shown[target] = member, str(output / local_name(relative))
            folders = {parent for target in planned for parent in target.parents}
            clash = next((target for target in planned if target in folders), None)
            if clash is not None:
                raise Fail(f"refusing the archive: {shown[clash]} is in it as a file and as a directory", EXIT_FAILED)
            if not force:
                refuse_existing(output, [str(Path(shown[target]).relative_to(output)) for target in planned])
            need, free = sum(member.size for member in planned.values()), shutil.disk_usage(output).free
            if need > free:  # a few kilobytes of gzip can unpack to gigabytes
                raise Fail(
                    f"refusing the archive: it unpacks to {need / 1e9:.2f} GB and {output} has {free / 1e9:.2f} GB "
                    "free (fetch single files with case get <id> <path>)",
                    EXIT_FAILED,
                )
            for target, member in planned.items():
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _write_whole(tar.extractfile(member), target)
                except OSError as exc:  # a name taken by a directory of yours, a full disk
                    raise Fail(
                        f"cannot write {shown[target]}: {exc.strerror or exc} ({len(written)} file(s) written)",
                        EXIT_FAILED,
                    ) from None
                written.append(shown[target])
    except (tarfile.TarError, EOFError, zlib.error) as exc:  # not a .tar.gz, or one cut short
        raise Fail(f"the case's archive is broken ({exc}); {len(written)} file(s) written", EXIT_UNAVAILABLE) from None
    return written


def _write_whole(source, target: Path) -> None:
    """``source`` (a file object) as ``target``, through a new hidden file beside it."""
    partial = target.with_name(f".{target.name}.{os.urandom(4).hex()}.part")
    try:
        with source, open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            while chunk := source.read(1024 * 1024):
                handle.write(chunk)
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


@case.command("cancel")
@click.argument("case_id")
@json_option
def case_cancel(case_id):
    """Cancel a case (a prepared one at once; a running one at its backend)."""
    with client() as api:
        found = api.cancel_case(case_id)
    emit(found, _case_words(found))


@case.command("list")
@click.option("--status", type=click.Choice(["prepared", "pending", "running", "done", "failed", "cancelled"]))
@json_option
def case_list(status):
    """Your cases."""
    with client() as api:
        rows = api.cases(status=status)

    def human(rows):
        for found in rows:
            say(_case_words(found))

    emit(rows, human)


def main(argv=None) -> int:
    """Console entry point; returns the exit status (``sys.exit(main())``). SIGTERM stops a
    command as Ctrl-C does (:class:`Interrupted`), cleaning up, with exit status 143."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminated)
    except ValueError:  # not the main thread (a test, an embedding program): left as it is
        previous = None
    try:
        cli.main(args=argv, prog_name="gridgate", standalone_mode=False)
    except click.exceptions.Abort as exc:  # a prompt's Ctrl-C or end of input (outside a command's own handling)
        if isinstance(exc.__context__, EOFError) or isinstance(exc.__cause__, EOFError):
            click.echo("gridgate: no input to answer the prompt (standard input is closed or empty)", err=True)
            return EXIT_USAGE
        interrupted = exc.__cause__ if isinstance(exc.__cause__, Interrupted) else None
        signum = interrupted.signum if interrupted else signal.SIGINT
        click.echo(f"gridgate: {'interrupted' if signum == signal.SIGINT else 'terminated'}", err=True)
        return 128 + signum
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def entry() -> None:
    sys.exit(main())
