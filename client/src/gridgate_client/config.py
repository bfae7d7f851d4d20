"""Where the client finds its server and token: ``GRIDGATE_URL`` and ``GRIDGATE_TOKEN`` first, then
what ``gridgate login`` stored.

Tokens are stored per server URL in ``<config dir>/gridgate/credentials.json`` (``~/.config`` or
``$XDG_CONFIG_HOME`` on Linux, click's ``get_app_dir`` elsewhere), the directory 0700 and the file
0600, written whole through a private temporary file so it is never readable by others, not even
for a moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import click

VERSION = "0.1.0"
DEFAULT_URL = "http://127.0.0.1:8000"
APP = "gridgate"


def config_dir() -> Path:
    return Path(click.get_app_dir(APP, force_posix=False))


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


#: names for which a URL given without a scheme means plain http (the local demo's)
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


class BadURL(ValueError):
    """A site's URL that cannot be read (``[::1`` without its bracket closed)."""


def normalize(url: str) -> str:
    """``url`` without a trailing slash, and with a scheme: a bare name means https (the password
    and the token must not cross the network in clear because a scheme was left out), except
    for this machine's own names (the local demo). The scheme and the host are lower-case (a site
    named in other capitals keeps one stored token)."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    url = f"{scheme}{sep}{rest.rstrip('/')}" if sep else url.rstrip("/")
    try:
        parts = urlsplit(url if sep else "//" + url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        raise BadURL(f"{url!r} is not a URL ({exc})") from None
    if sep and scheme.lower() not in ("http", "https"):
        raise BadURL(f"{url!r} is not a site's address: Gridgate is reached over https:// (or http://)")
    if any(char.isspace() for char in url):
        raise BadURL(f"{url!r} is not a URL (a space in it)")
    if not host:
        raise BadURL(f"{url!r} names no site: give one such as https://gridgate.example.org")
    if not sep:
        url = ("http://" if host in LOCAL_HOSTS else "https://") + url
    parts = urlsplit(url)
    userinfo, at, host_port = parts.netloc.rpartition("@")
    return urlunsplit((parts.scheme.lower(), f"{userinfo}{at}{host_port.lower()}", *parts[2:]))


def _read() -> dict:
    """The credentials file as ``{"servers": {url: entry}, "default_url": url}``; a file edited by
    hand into another shape reads as far as it keeps this one (an entry that is not an object is
    left out), never as an exception."""
    path = credentials_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {"servers": {}}
    if not isinstance(data, dict):
        return {"servers": {}}
    servers = data.get("servers")
    data["servers"] = {
        url: entry for url, entry in (servers.items() if isinstance(servers, dict) else []) if isinstance(entry, dict)
    }
    if not isinstance(data.get("default_url"), str):
        data.pop("default_url", None)
    return data


def _write(data: dict) -> Path:
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    fd, temporary = tempfile.mkstemp(prefix=".credentials-", dir=directory)  # created 0600
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
        os.chmod(temporary, 0o600)
        os.replace(temporary, credentials_path())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return credentials_path()


def resolve_url(url: str | None = None) -> str:
    """The URL given, else ``GRIDGATE_URL``, else the one ``gridgate login`` stored last, else the
    local demo's."""
    chosen = url or os.environ.get("GRIDGATE_URL") or _read().get("default_url") or DEFAULT_URL
    return normalize(chosen)


def resolve_token(url: str) -> str:
    """``GRIDGATE_TOKEN``, else the token stored for ``url``; '' when there is none."""
    env = os.environ.get("GRIDGATE_TOKEN")
    if env:
        return env.strip()
    token = _read()["servers"].get(normalize(url), {}).get("token")
    return token if isinstance(token, str) else ""


def plain_http_twin(url: str) -> str | None:
    """For an https ``url`` with no token stored: the same site's ``http://`` address when a token
    is stored under it (a login that named the site bare before a bare name meant https)."""
    if not url.startswith("https://"):
        return None
    twin = "http://" + url[len("https://") :]
    entry = _read().get("servers", {}).get(twin)
    return twin if isinstance(entry, dict) and entry.get("token") else None


def store_token(url: str, token: str, **extra) -> Path:
    """Keep ``token`` for ``url`` (0600) and make ``url`` the default server."""
    data = _read()
    servers = data.setdefault("servers", {})
    servers[normalize(url)] = {"token": token, **{k: v for k, v in extra.items() if v is not None}}
    data["default_url"] = normalize(url)
    return _write(data)


def forget_token(url: str) -> dict | None:
    """Forget what is stored for ``url``; returns it (None when nothing was)."""
    data = _read()
    removed = data.get("servers", {}).pop(normalize(url), None)
    if removed is not None:
        _write(data)
    return removed
