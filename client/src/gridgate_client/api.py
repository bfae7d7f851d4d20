"""A small client of Gridgate's REST API (``/api/v1/``) on httpx: what the CLI, the Pulser
connection and your scripts share.

- Errors: every non-2xx answer raises :class:`GridgateError` with the server's ``detail`` (or its
  field messages) and status; a connection failure raises one with ``status=None``.
- Retries: a 429, 502, 503 or 504 is retried after the server's ``Retry-After`` (transient by
  definition: docs/api.md; a proxy's 502/504 while the site restarts), a dropped connection after
  a back-off; writes are retried only when they carry an ``Idempotency-Key`` (the server then
  answers a repeat with the first answer, never twice).
- Waiting: :meth:`Client.wait_job` and :meth:`Client.wait_case` poll with a back-off (0.5 s,
  doubling to 10 s) and stop at a deadline with :class:`TimedOut`.
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gridgate_client import config

JOB_DONE = {"completed", "failed", "cancelled", "unknown"}
CASE_DONE = {"done", "failed", "cancelled"}
#: answers retried (a request that is safe to repeat): throttled (429), and the site or a proxy in
#: front of it failing for a moment (502 Bad Gateway, 503, 504 Gateway Timeout: a restart, a worker
#: busy past the proxy's patience)
RETRY_STATUSES = {429, 502, 503, 504}
MAX_RETRIES = 5
MAX_RETRY_AFTER = 300.0  # a Retry-After longer than this is not waited out: the error is raised
#: the most of an answer (decompressed) read into memory; files go to disk (:meth:`Client.download`)
MAX_ANSWER_BYTES = 64 << 20


#: what a token is made of: printable ASCII, no space (personal tokens are hex, a provider's a JWT)
TOKEN_CHARACTERS = re.compile(r"[\x21-\x7e]+")


class GridgateError(Exception):
    """The server refused the request, or could not be reached (``status`` None).

    ``detail`` is the server's own words (``detail``, or the field messages of a 400), ``body``
    the parsed JSON answer (extra fields such as ``status`` or ``slots_available``)."""

    def __init__(self, detail: str, *, status: int | None = None, body: dict | None = None):
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.body = body or {}


class TimedOut(Exception):
    """A wait reached its deadline; ``last`` is the object as last read."""

    def __init__(self, message: str, last: dict | None = None):
        super().__init__(message)
        self.last = last


def error_detail(body) -> str:
    """The server's words from an error body: ``detail``, else ``field: message`` pairs."""
    if isinstance(body, dict):
        if isinstance(body.get("detail"), str):
            return body["detail"]
        parts = []
        for key, value in body.items():
            text = " ".join(str(v) for v in value) if isinstance(value, list) else str(value)
            parts.append(text if key in ("non_field_errors", "detail") else f"{key}: {text}")
        if parts:
            return "; ".join(parts)
    if isinstance(body, list):
        return "; ".join(str(item) for item in body)
    return str(body)


def _without(value, secret: str):
    """``value`` (text, or JSON's lists and objects of it) with ``secret`` written as ``***``."""
    if isinstance(value, str):
        return value.replace(secret, "***")
    if isinstance(value, list):
        return [_without(item, secret) for item in value]
    if isinstance(value, dict):
        return {_without(key, secret): _without(item, secret) for key, item in value.items()}
    return value


def answer_json(response: httpx.Response):
    """The answer's JSON document; an answer that is not one (a proxy's sign-in page, a body cut
    short, arrays nested past what the parser can take) is a :class:`GridgateError`, never a
    parser's exception escaping to the caller (the CLI would print a traceback)."""
    try:
        return response.json()
    except (ValueError, RecursionError):
        kind = response.headers.get("Content-Type", "no content type").split(";", 1)[0]
        raise GridgateError(
            f"{response.url.host} answered HTTP {response.status_code} with something that is not Gridgate's JSON "
            f"({kind}): is the URL Gridgate's?"
        ) from None


def page_text(text: str, content_type: str = "") -> str:
    """What an answer that is not JSON says, on one line: an HTML page's title (a proxy's "502 Bad
    Gateway"), else its text without its tags; white space, newlines included, as single spaces."""
    if "html" in content_type.lower() or text.lstrip().startswith("<"):
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = title.group(1) if title and title.group(1).strip() else re.sub(r"<[^>]*>", " ", text)
        text = html.unescape(text)
    return " ".join(text.split())


def transport_words(exc: httpx.TransportError) -> str:
    """What went wrong on the way, in words: some of httpx's errors carry none."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer in time: {exc}" if str(exc) else "no answer in time"
    return str(exc) or type(exc).__name__


def retry_after(response: httpx.Response) -> float | None:
    """The server's ``Retry-After`` in seconds (a number; an HTTP date is not sent by Gridgate)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@dataclass
class Backoff:
    """Poll intervals: ``first``, doubling to ``cap``; a server's Retry-After wins when longer."""

    first: float = 0.5
    cap: float = 10.0
    factor: float = 2.0
    _next: float = field(default=0.0, init=False)

    def next(self, server_asks: float | None = None) -> float:
        self._next = self.first if not self._next else min(self.cap, self._next * self.factor)
        return max(self._next, server_asks or 0.0)

    def reset(self) -> None:
        self._next = 0.0


class Client:
    """``Client(url, token)``; both default to ``GRIDGATE_URL``/``GRIDGATE_TOKEN``, then to what
    ``gridgate login`` stored for that URL. ``sleep`` and ``transport`` are for tests."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = config.resolve_url(url)
        self.token = token if token is not None else config.resolve_token(self.url)
        if self.token and not TOKEN_CHARACTERS.fullmatch(self.token):
            # Sent as is, it would fail inside httpx: a traceback (a non-ASCII letter), or an error
            # quoting the header, the token with it (a line break pasted into GRIDGATE_TOKEN).
            raise GridgateError(
                "The token has characters no token has (a space or a line break inside it, a letter that is "
                "not ASCII): set GRIDGATE_TOKEN again, or log in again (gridgate login)",
                status=401,
            )
        headers = {"User-Agent": f"gridgate-client/{config.VERSION}", "Accept": "application/json"}
        if self.token:
            scheme = "Bearer" if self.token.count(".") == 2 else "Token"  # a provider's JWT, else a personal token
            headers["Authorization"] = f"{scheme} {self.token}"
        self.http = httpx.Client(
            base_url=self.url.rstrip("/") + "/api/v1/", headers=headers, timeout=timeout, transport=transport
        )
        self.sleep = sleep
        self.clock = clock
        self.max_answer_bytes = MAX_ANSWER_BYTES
        #: called with one line before each retry (why, and when the next try is); the CLI prints it
        self.on_retry: Callable[[str], None] | None = None

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport ----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, retry: bool | None = None, **kwargs) -> httpx.Response:
        """One request, retried on 429/502/503/504 (after ``Retry-After``) and on a dropped connection
        when it is safe to (a read, a delete, or a write with an ``Idempotency-Key``)."""
        headers = kwargs.get("headers") or {}
        if retry is None:
            retry = method in ("GET", "HEAD", "DELETE") or "Idempotency-Key" in headers
        backoff = Backoff(first=1.0, cap=30.0)
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self.http.send(self.http.build_request(method, path, **kwargs), stream=True)
                try:
                    self._read(response)
                finally:
                    response.close()
            except httpx.TransportError as exc:
                if retry and attempt < MAX_RETRIES:
                    self._pause(
                        f"cannot reach {self.http.base_url.host} ({transport_words(exc)})", backoff.next(), attempt
                    )
                    continue
                raise GridgateError(self._scrub(f"Cannot reach {self.url}: {transport_words(exc)}")) from None
            if response.status_code in RETRY_STATUSES and retry and attempt < MAX_RETRIES:
                wait = retry_after(response)
                if wait is None or wait <= MAX_RETRY_AFTER:
                    said = f"{response.url.host} answered HTTP {response.status_code} {response.reason_phrase}".strip()
                    self._pause(said, backoff.next(wait), attempt)
                    continue
            if response.status_code >= 300:  # a redirect is not followed: the token would go with it
                raise self._refusal(response)
            return response

    def _pause(self, why: str, seconds: float, attempt: int) -> None:
        """Wait before trying again, telling :attr:`on_retry` why: a retry can take minutes (five
        tries of a server that does not answer in ``timeout``), which must not look like a hang."""
        if self.on_retry:
            self.on_retry(f"{why}; trying again in {seconds:.0f} s (try {attempt + 1} of {MAX_RETRIES})")
        self.sleep(seconds)

    def _read(self, response: httpx.Response) -> None:
        """Read the answer into ``response.content``, at most :attr:`max_answer_bytes` once
        decompressed: a server (or whatever answers in its place) cannot make the client hold
        gigabytes, nor a small gzip body that inflates to them."""
        chunks, size = [], 0
        try:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > self.max_answer_bytes:
                    raise GridgateError(
                        f"{response.url.host} sent an answer of more than {self.max_answer_bytes >> 20} MiB: "
                        "not read (is the URL Gridgate's?)"
                    )
                chunks.append(chunk)
        except httpx.DecodingError:
            raise GridgateError(
                f"{response.url.host} sent an answer that cannot be decoded (its Content-Encoding)"
            ) from None
        response._content = b"".join(chunks)  # what httpx's own read() keeps

    def _scrub(self, text: str) -> str:
        """``text`` with this client's token written as ``***``."""
        token = self.token if self.token and len(self.token) >= 8 else None
        return text.replace(token, "***") if token else text

    def _refusal(self, response: httpx.Response) -> GridgateError:
        """The error an answer that is no success stands for, in the server's words, without this
        client's token in them (scrubbed before the text is cut short): a proxy's error page or a
        debugging server may quote the request's headers, and the CLI prints errors where a batch
        job's log keeps them."""
        scrub = self._scrub
        if response.is_redirect:
            where = scrub(response.headers.get("Location", ""))
            return GridgateError(
                f"HTTP {response.status_code}: the server answered with a redirect to {where!r}, which is not "
                "followed (check the URL: https, the right host)",
                status=response.status_code,
            )
        try:
            body = json.loads(scrub(response.text))
        except (ValueError, RecursionError):
            body = None
        if body is None:
            said = page_text(scrub(response.text), response.headers.get("Content-Type", ""))[:300]
            where = f"HTTP {response.status_code} {response.reason_phrase} from {response.url.host}".strip()
            why = (
                "the site, or a proxy in front of it, is failing: try again later"
                if response.status_code >= 500
                else "is the URL Gridgate's?"
            )
            return GridgateError(
                f"{where}, not Gridgate's answer" + (f" ({said})" if said else "") + f": {why}",
                status=response.status_code,
            )
        return GridgateError(
            error_detail(body), status=response.status_code, body=body if isinstance(body, dict) else {}
        )

    def get(self, path: str, **params) -> dict | list:
        return answer_json(self.request("GET", path, params={k: v for k, v in params.items() if v is not None}))

    def post(self, path: str, body: dict | None = None, *, idempotent: bool = False, **kwargs) -> dict:
        headers = {"Idempotency-Key": uuid.uuid4().hex} if idempotent else {}
        response = self.request("POST", path, json=body if body is not None else {}, headers=headers, **kwargs)
        return answer_json(response) if response.content else {}

    def paginate(self, path: str, **params) -> Iterator[dict]:
        """Every row of a paginated list (``{"count", "next", "results"}``), page by page, up to
        the first page's ``count``: a server whose ``next`` never ends cannot keep it reading."""
        params = {k: v for k, v in params.items() if v is not None}
        params.setdefault("page_size", 200)
        page, read, count = 1, 0, None
        while True:
            body = answer_json(self.request("GET", path, params={**params, "page": page}))
            if isinstance(body, list):  # an unpaginated list
                yield from body
                return
            rows = body.get("results") or []
            yield from rows
            read += len(rows)
            count = body.get("count") if count is None else count
            if not body.get("next") or not rows or (isinstance(count, int) and read >= count):
                return
            page += 1

    # -- login --------------------------------------------------------------------------------
    def login_methods(self) -> dict:
        return self.get("auth/methods/")

    def password_login(self, username: str, password: str, *, name: str = "") -> dict:
        """A personal token (``{"token", "expires_at"}``) for ``username``; never retried, so a
        wrong password counts once against the lock-out."""
        body = {"username": username, "password": password}
        if name:
            body["name"] = name[:100]
        try:
            return answer_json(self.request("POST", "auth/token/", json=body, retry=False))
        except GridgateError as exc:
            if len(password) < 4:
                raise
            # A proxy's error page or a debugging server may quote the request's body.
            raise GridgateError(
                _without(exc.detail, password), status=exc.status, body=_without(exc.body, password)
            ) from None

    # -- pools and sessions ---------------------------------------------------------------------
    def pools(self) -> list[dict]:
        return list(self.paginate("resource-pools/"))

    def allocations(self) -> list[dict]:
        """Your projects' allocations (staff: all): granted, used and remaining this period."""
        return list(self.paginate("allocations/"))

    def pool(self, name_or_id: str | int) -> dict:
        """A pool by id or by name (a 404-like error naming the pools you can see otherwise)."""
        text = str(name_or_id)
        if text.isdigit():
            return self.get(f"resource-pools/{text}/")
        found = [pool for pool in self.paginate("resource-pools/", name=text) if pool["name"] == text]
        if not found:
            names = ", ".join(sorted(pool["name"] for pool in self.pools())) or "none"
            raise GridgateError(f"No pool named {text!r} that you can see (yours: {names}).", status=404)
        return found[0]

    @staticmethod
    def class_of(pool: dict, name: str | None = None) -> dict:
        """The pool's class named ``name``, else its default class."""
        classes = pool.get("classes") or []
        for klass in classes:
            if (name and klass["name"] == name) or (not name and klass.get("default")):
                return klass
        wanted = f"class {name!r}" if name else "a default class"
        known = ", ".join(klass["name"] for klass in classes) or "none"
        raise GridgateError(f"Pool {pool['name']!r} has no {wanted} (classes: {known}).", status=404)

    def open_session(self, *, resource_class: int, slots: int = 1, external_id: str | None = None) -> dict:
        body = {"resource_class": resource_class, "slots": slots}
        if external_id:
            body["external_id"] = external_id
        return self.post("sessions/", body, idempotent=True)

    def sessions(self, **filters) -> list[dict]:
        return list(self.paginate("sessions/", **filters))

    def session(self, session_id: str) -> dict:
        return self.get(f"sessions/{session_id}/")

    def revoke_token(self, token_id: int) -> None:
        """Revoke one of the caller's personal tokens (the one it sends: logging out)."""
        self.request("DELETE", f"auth/tokens/{int(token_id)}/")

    def close_session(self, session_id: str) -> None:
        """Release (idempotent: an ended session is fine)."""
        self.request("DELETE", f"sessions/{session_id}/")

    # -- jobs -----------------------------------------------------------------------------------
    def submit_job(self, session_id: str, payload: dict, shots: int, device: int | None = None) -> dict:
        body = {"payload": payload, "shots": shots}
        if device is not None:
            body["device"] = device
        return self.post(f"sessions/{session_id}/jobs/", body, idempotent=True)

    def session_jobs(self, session_id: str) -> list[dict]:
        return self.get(f"sessions/{session_id}/jobs/")

    def job(self, job_id: int | str) -> dict:
        return self.get(f"jobs/{job_id}/")

    def jobs(self, **filters) -> list[dict]:
        return list(self.paginate("jobs/", **filters))

    def cancel_job(self, job_id: int | str) -> dict:
        return self.post(f"jobs/{job_id}/cancel/")

    def job_result(self, job_id: int | str) -> dict:
        return self.get(f"jobs/{job_id}/result/")

    def job_result_csv(self, job_id: int | str) -> str:
        response = self.request(
            "GET", f"jobs/{job_id}/result/", params={"format": "csv"}, headers={"Accept": "text/csv"}
        )
        return response.text

    def wait_job(self, job_id, *, timeout: float | None = None, on_poll: Callable[[dict], None] | None = None) -> dict:
        return self._wait(lambda: self.job(job_id), JOB_DONE, f"job {job_id}", timeout, on_poll)

    # -- cases ----------------------------------------------------------------------------------
    def create_case(
        self,
        *,
        resource_class: int,
        name: str,
        command: str,
        inputs: Iterable[Path] = (),
        launch_options: dict | None = None,
        observability_globs: list[str] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict:
        """A prepared case with ``inputs`` (files) uploaded in one multipart request."""
        data = {"name": name, "resource_class": str(resource_class), "command": command}
        if launch_options:
            data["launch_options"] = json.dumps(launch_options)
        for glob in observability_globs or []:
            data.setdefault("observability_globs", []).append(glob)
        handles = [(path.name, _ProgressFile(path, progress)) for path in inputs]
        try:
            files = [("inputs", (name, handle, "application/octet-stream")) for name, handle in handles]
            response = self.request(
                "POST",
                "cases/",
                data=data,
                files=files or None,
                headers={"Idempotency-Key": uuid.uuid4().hex},
                retry=False,  # a file body cannot be sent twice from a spent handle
            )
        finally:
            for _, handle in handles:
                handle.close()
        return answer_json(response)

    def launch_case(self, case_id: str, launch_options: dict | None = None) -> dict:
        return self.post(f"cases/{case_id}/launch/", {"launch_options": launch_options or {}}, idempotent=True)

    def case(self, case_id: str) -> dict:
        return self.get(f"cases/{case_id}/")

    def cases(self, **filters) -> list[dict]:
        return list(self.paginate("cases/", **filters))

    def cancel_case(self, case_id: str) -> dict:
        return self.post(f"cases/{case_id}/cancel/")

    def case_files(self, case_id: str) -> list[dict]:
        return list(self.paginate(f"cases/{case_id}/files/"))

    def case_logs(self, case_id: str, stream: str = "stdout", tail: int = 200) -> str:
        return self.request("GET", f"cases/{case_id}/logs/", params={"stream": stream, "tail": tail}).text

    def case_log_chunk(self, case_id: str, stream: str, offset: int) -> tuple[str, int]:
        """The log from byte ``offset`` on (a bounded chunk) and the offset to ask next."""
        response = self.request("GET", f"cases/{case_id}/logs/", params={"stream": stream, "offset": offset})
        try:
            return response.text, int(response.headers.get("X-Log-Offset", offset))
        except ValueError:
            offset_header = response.headers["X-Log-Offset"]
            raise GridgateError(f"The server's X-Log-Offset is not a byte offset: {offset_header!r}") from None

    def follow_logs(self, case_id: str, stream: str = "stdout", *, timeout: float | None = None) -> Iterator[str]:
        """The log's text as it grows, until the case has ended and everything was read."""
        offset, backoff = 0, Backoff(first=0.5, cap=5.0)
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            case = self.case(case_id)  # read first: what is logged before the end is all read below
            while True:
                text, offset_after = self.case_log_chunk(case_id, stream, offset)
                if offset_after == offset:
                    break
                offset = offset_after
                backoff.reset()
                yield text
            if case["status"] in CASE_DONE:
                return
            if deadline is not None and self.clock() >= deadline:
                raise TimedOut(f"case {case_id} still {case['status']}", case)
            self.sleep(backoff.next())

    def download(self, path: str, dest: Path, *, progress: Callable[[int, int | None], None] | None = None) -> Path:
        """Stream ``path`` (an API path) into ``dest``; ``progress(bytes so far, total or None)``.

        The bytes go to a new hidden file beside ``dest`` (``.<name>.<random>.part``, created
        with ``O_EXCL``: never a file of yours, nor a link planted there), renamed onto ``dest``
        once whole. Whatever stops it (a dropped connection, a full disk, Ctrl-C) removes that
        file: half a file is never left behind, under either name. A local failure (a directory
        where the file goes, no room, no permission) raises :class:`OSError`."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")
        handle = open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")  # noqa: SIM115
        try:
            with handle, self.http.stream("GET", path) as response:
                if response.status_code >= 300:  # a redirect's body is not the file
                    self._read(response)
                    raise self._refusal(response)
                length = response.headers.get("Content-Length", "")
                total = int(length) if length.isdigit() else None
                done = 0
                for chunk in response.iter_bytes():
                    handle.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
            os.replace(partial, dest)
        except (httpx.TransportError, httpx.DecodingError) as exc:
            partial.unlink(missing_ok=True)  # half a file is not the file
            raise GridgateError(self._scrub(f"The download from {self.url} failed: {transport_words(exc)}")) from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return dest

    def download_case_file(self, case_id: str, path: str, dest: Path, **kwargs) -> Path:
        from urllib.parse import quote

        return self.download(f"cases/{case_id}/files/{quote(path)}", dest, **kwargs)

    def download_case_archive(self, case_id: str, dest: Path, **kwargs) -> Path:
        return self.download(f"cases/{case_id}/archive/", dest, **kwargs)

    def wait_case(
        self, case_id, *, timeout: float | None = None, on_poll: Callable[[dict], None] | None = None
    ) -> dict:
        return self._wait(lambda: self.case(case_id), CASE_DONE, f"case {case_id}", timeout, on_poll)

    # -- devices ------------------------------------------------------------------------------
    def devices(self, pool_id: int) -> list[dict]:
        return [device for device in self.paginate("devices/", pool=pool_id) if device["pool"] == pool_id]

    def device_specs(self, device_id: int) -> dict:
        return self.get(f"devices/{device_id}/specs/")

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, read, final: set, what: str, timeout, on_poll) -> dict:
        deadline = None if timeout is None else self.clock() + timeout
        backoff = Backoff()
        last_status = None
        while True:
            obj = read()
            if on_poll:
                on_poll(obj)
            if obj["status"] in final:
                return obj
            if obj["status"] != last_status:
                last_status = obj["status"]
                backoff.reset()  # it moved: look again soon
            pause = backoff.next()
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    raise TimedOut(f"{what} is still {obj['status']}", obj)
                pause = min(pause, left)
            self.sleep(pause)


class _ProgressFile:
    """A file opened for upload that reports how many bytes were read."""

    def __init__(self, path: Path, progress):
        self._handle = Path(path).open("rb")  # noqa: SIM115 - closed by create_case
        self._progress = progress

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        if self._progress and data:
            self._progress(len(data))
        return data

    def __iter__(self):
        while chunk := self.read(64 * 1024):
            yield chunk

    # httpx sizes the multipart body from these (a Content-Length, never a chunked upload).
    def fileno(self) -> int:
        return self._handle.fileno()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        self._handle.close()
