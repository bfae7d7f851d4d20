"""Typed readers for environment variables.

Every reader fails with ``ImproperlyConfigured`` naming the variable, so a bad deployment value
stops the process at start instead of surfacing later as an obscure error.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean: use true or false.")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at most {maximum}.")
    return value


def env_choice(name: str, default: str, choices: list[str]) -> str:
    value = (os.environ.get(name) or default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}.")
    return value


def env_prepare_threshold(name: str, default: int) -> int | None:
    """A whole number of executions before psycopg prepares a statement, or ``off`` (None)."""
    raw = os.environ.get(name, "")
    if raw.strip().lower() in {"off", "none", "false", "no"}:
        return None
    return env_int(name, default, minimum=0)


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_mapping(name: str) -> dict[str, str] | None:
    """``key=value,key=value`` → dict (e.g. pool kind → backend name); None when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    out = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ImproperlyConfigured(f"{name}={raw!r}: expected key=value pairs separated by commas.")
        out[key.strip()] = value.strip()
    return out


def env_int_list(name: str, default: list[int]) -> list[int]:
    try:
        return [int(item) for item in env_list(name, [str(v) for v in default])]
    except ValueError:
        raise ImproperlyConfigured(f"{name}={os.environ.get(name)!r} must be comma-separated whole numbers.") from None


def env_networks(name: str) -> tuple:
    """Comma-separated CIDRs (``10.0.0.0/8,::1``) → ``ip_network`` objects; a bare address is a /32
    (/128). Host bits set (``10.0.0.1/8``) are refused: they usually mean a typo."""
    import ipaddress

    out = []
    for item in env_list(name, []):
        try:
            out.append(ipaddress.ip_network(item))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network in CIDR form ({exc}).") from None
    return tuple(out)


def env_proxy_networks(name: str) -> tuple:
    """The reverse proxies' networks (``127.0.0.1,10.0.3.0/24``). A bare number is the former
    count of proxies, which believed X-Forwarded-For from whoever reached the web process
    directly: refused, naming what to write instead."""
    raw = (os.environ.get(name) or "").strip()
    if raw.isdigit():
        if raw == "0":
            return ()
        raise ImproperlyConfigured(
            f"{name}={raw}: a count of proxies is no longer accepted (any client reaching the web process "
            "directly could pick its own address); list the proxies' addresses or networks instead, e.g. "
            f"{name}=127.0.0.1 for an nginx on the same host (docs/deployment.md)."
        )
    return env_networks(name)


def private_sqlite_file(name) -> None:
    """The SQLite file, created 0600 before SQLite opens it (SQLite creates it with the umask's
    mode, 0644 under the usual 022, and its journals take the file's mode): it holds password
    hashes, session keys and token digests. An existing file of this account's that others may
    read is closed the same way; an in-memory database has no file."""
    path = str(name)
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ImproperlyConfigured(f"the SQLite database {path} cannot be opened ({exc.strerror}).") from None
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def env_database(name: str, default_sqlite: Path) -> dict:
    """Parse ``DATABASE_URL`` (postgres:// or sqlite:///), defaulting to an embedded SQLite file.

    SQLite gets ``transaction_mode: IMMEDIATE``: a deferred transaction that later needs the write
    lock fails with "database is locked" instead of waiting, which breaks serialized admission.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        default_sqlite.parent.mkdir(parents=True, exist_ok=True)
        config = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(default_sqlite)}
    else:
        try:
            config = dj_database_url.parse(raw.strip())
        except Exception as exc:  # dj-database-url raises several types for malformed URLs
            raise ImproperlyConfigured(
                f"{name} is not a valid database URL ({exc}). Expected "
                "postgres://user:password@host:port/name or sqlite:///path."
            ) from None
        engine = config.get("ENGINE", "")
        if engine not in {
            "django.db.backends.postgresql",
            "django.db.backends.sqlite3",
        }:
            raise ImproperlyConfigured(
                f"{name} uses an unsupported database ({engine or 'unknown'}): use postgres:// or sqlite:///."
            )
        if engine.endswith("postgresql") and not config.get("NAME"):
            raise ImproperlyConfigured(f"{name} names no database (postgres://host:port/NAME).")
        if engine.endswith("sqlite3") and not config.get("NAME"):
            raise ImproperlyConfigured(f"{name} names no SQLite file (sqlite:///path).")
    if config["ENGINE"].endswith("sqlite3"):
        private_sqlite_file(config["NAME"])
        config.setdefault("OPTIONS", {})
        config["OPTIONS"].update({"transaction_mode": "IMMEDIATE", "timeout": 30})
    else:
        config["ENGINE"] = "config.postgresql"  # Django's, with batches within the parameter limit
        config.setdefault("OPTIONS", {})
        config["OPTIONS"].setdefault("connect_timeout", 5)
        # Prepared statements: PostgreSQL parses and plans every statement it is sent as text, most
        # of its CPU per job submission. Bound on the server, a statement run this many times on
        # one connection is prepared there and then only executed, which serves more submissions
        # and cycles per second (docs/deployment.md, "Database connections"). "off" keeps Django's
        # client-side binding, for PgBouncer in transaction mode without prepared-statement support
        # (max_prepared_statements = 0).
        threshold = env_prepare_threshold("DATABASE_PREPARE_THRESHOLD", 5)
        if threshold is not None:
            config["OPTIONS"].update(server_side_binding=True, prepare_threshold=threshold)
    # Persistent connections: a new PostgreSQL connection per request was a sizeable share of the
    # request time (docs/deployment.md). Each web thread and worker process keeps its own; 0 closes
    # after every request. No health check by default: Django's pings a reused connection with a
    # round trip at every request (as much as a submission's own statements cost). Without it, a
    # restarted database costs each thread's next request a 503 JSON answer (Retry-After; the
    # connection is closed after it and the next request opens a new one), never a 500.
    config["CONN_MAX_AGE"] = env_int("CONN_MAX_AGE", 600, minimum=0)
    config["CONN_HEALTH_CHECKS"] = env_bool("CONN_HEALTH_CHECKS", False)
    return config


def with_query_defaults(url: str, **defaults: str) -> str:
    """``url`` with each of ``defaults`` added to its query string unless it already sets it."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key, value in defaults.items():
        query.setdefault(key, value)
    return urlunsplit(parts._replace(query=urlencode(query)))


def require_allowed_hosts(debug: bool, allowed_hosts: list[str]) -> None:
    """Refuse to serve with DEBUG off and no ALLOWED_HOSTS (every request would get 400).

    Called where the web application is built (config/wsgi.py, config/asgi.py), not in the
    settings: management commands and workers need no host names.
    """
    if not debug and not allowed_hosts:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS is empty and DEBUG is off: every request would be refused with 400. Set "
            "ALLOWED_HOSTS to the host names users reach the site by (comma-separated, e.g. "
            "ALLOWED_HOSTS=gridgate.example.org), or DEBUG=true for local development."
        )


def embedded_secret_key(path: Path) -> str:
    """The embedded set-up's key: generated once into ``var/`` (mode 600) when SECRET_KEY is unset.

    Production sets ``SECRET_KEY``; this keeps ``make run`` and management commands working on a
    fresh clone without ever shipping a fixed key.
    """
    import secrets

    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ImproperlyConfigured(f"SECRET_KEY is unset and {path} cannot be read ({exc}).") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key
