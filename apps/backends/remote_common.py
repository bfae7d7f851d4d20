"""Helpers shared by the backends that talk to a provider over HTTP (FirecREST, Qarnot, Run:AI).

Credentials (R-BACK-1) are read from the environment variables the pool's ``remote`` names, at
the moment of use, and never leave this process: :func:`scrub` removes their values from any text
that could reach a user (exception messages, doctor lines) as a last line of defence, in case a
provider or an SDK echoes them back.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import re
from pathlib import Path, PurePosixPath
from secrets import token_hex
from urllib.parse import quote, quote_plus

from apps.backends import files
from apps.backends.base import BackendError
from apps.backends.files import PROGRESS_FILE
from apps.core import credentials

#: a live file larger than this is not pulled while the case runs (results bring it at the end)
LIVE_MAX_BYTES = 8 << 20


def env_secret(name: str, what: str, remote: dict) -> str:
    """The credential ``name`` for the pool whose ``remote_config()`` is ``remote`` (it carries
    the pool's id: the variable must be bound to that pool, ``apps.core.credentials``). A variable
    unset or not a credential variable is a :class:`BackendError` naming it, never a value."""
    try:
        return credentials.read(name, what, pool=remote.get(credentials.POOL_KEY))
    except credentials.CredentialError as exc:
        raise BackendError(str(exc)) from None


def scrub_for_pool(pool, text) -> str:
    """``text`` without the values of the credentials ``pool``'s ``remote`` names (its ``*_env``
    keys; R-BACK-1), read from the environment at the moment of use, never stored or shown."""
    return scrub(str(text), credentials.values_named_in(getattr(pool, "remote", None)))


def secret_forms(secrets: list[str]) -> list[str]:
    """Every form in which a provider may echo a credential back: as is, percent-encoded (a
    form-encoded token request: ``quote`` and ``quote_plus``, upper- and lower-case escapes),
    JSON-escaped (a body quoting the request), and as HTTP Basic credentials (base64 of
    ``id:secret`` for each pair of the values, and of each value alone). Longest first, so a
    form is replaced before a shorter one inside it."""
    values = list(dict.fromkeys(secret for secret in secrets if secret and len(secret) >= 4))
    forms = set()
    for value in values:
        for encoded in (value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]):
            forms.update({encoded, encoded.lower() if "%" in encoded else encoded})
        forms.add(base64.b64encode(value.encode()).decode().rstrip("="))
    for first, second in itertools.permutations(values, 2):
        forms.add(base64.b64encode(f"{first}:{second}".encode()).decode().rstrip("="))
    return sorted(forms, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every credential value replaced by ``***`` (R-BACK-1), in every form a
    provider may echo it in (:func:`secret_forms`)."""
    out = str(text)
    for form in secret_forms(secrets):
        out = out.replace(form, "***")
    return out


def provider_words(text: str, *, service: bool, status: int | None = None) -> str:
    """What may be said of a provider's answer (``text``: its words, already scrubbed) in an error
    users see. A per-user pool's users talk to the provider as themselves: its words. On a pool
    that runs under the service's account, every user of the pool would read what the provider
    answered the *service* (an error body may quote the service's request, its account, other
    tenants' jobs): they get the status and a reference, and the words go to the log under that
    reference, for the operators."""
    if not service:
        return text
    reference = token_hex(4)
    logging.getLogger(__name__).warning("provider answer %s: %s", reference, text)
    answered = f"answered HTTP {status}" if isinstance(status, int) else "refused"
    return f"the provider {answered} (reference {reference}: an operator finds its words in the logs)"


def globs_to_regex(globs: list[str]) -> str:
    """One anchored regular expression for a provider-side filter (Qarnot's snapshot whitelist)
    matching exactly what :func:`privileged.glob_matches` matches. Written by hand rather than with
    ``fnmatch.translate``, whose ``(?s:…)\\Z`` output is Python-specific."""
    parts = []
    for pattern in list(globs or []) + [PROGRESS_FILE]:
        out, i = [], 0
        while i < len(pattern):
            char = pattern[i]
            if char == "*":
                out.append(".*")
            elif char == "?":
                out.append(".")
            elif char == "[":
                end = pattern.find("]", i + 1)
                if end == -1:
                    out.append(re.escape(char))
                else:
                    body = pattern[i + 1 : end]
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    out.append("[" + body.replace("\\", "\\\\") + "]")
                    i = end
            else:
                out.append(re.escape(char))
            i += 1
        parts.append("".join(out))
    return "^(" + "|".join(parts) + ")$"


def safe_relative(key: str) -> str | None:
    """A provider-supplied object key or path as a safe relative path, or None.

    The Qarnot SDK's ``get_all_files`` does not sanitise keys (``..`` escapes the target), and a
    remote listing is data from outside: never let it choose where a file lands (R-CASE-7).
    """
    if not key or "\x00" in key or "\\" in key:
        return None
    pure = PurePosixPath(key)
    if pure.is_absolute() or any(part in ("..", "") for part in key.split("/")):
        return None
    return pure.as_posix()


def download_atomically(target: Path, fetch) -> None:
    """``fetch(path)`` writes the file beside ``target``, which it replaces once complete (a
    reader never sees half of it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    fetch(str(tmp))
    tmp.replace(target)


def confined_target(root: Path, rel: str) -> Path | None:
    """``root/rel`` if it stays inside ``root`` (symlinks already in ``root`` included)."""
    safe = safe_relative(rel)
    if safe is None:
        return None
    base = root.resolve()
    target = (base / safe).resolve(strict=False)
    return target if target.is_relative_to(base) else None


# -- the backend's own state in a case workspace (every remote provider) --------------------------
# Manifests of the inputs' hashes, what was synced, Qarnot's output spool (the job's stdout): the
# service's alone. The case directory is traversable by every account (0711), so the state
# directory is 0700 and its files 0600 (0755 and 0644 made them readable by anyone who knew the
# case id, which the provider's job name shows).
def state_dir(workspace: Path, name: str) -> Path:
    """``workspace/name``, the backend's state directory, created (or closed, if an earlier
    version made it 0755) 0700."""
    folder = workspace / name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def load_state(workspace: Path, directory: str, name: str) -> dict:
    try:
        return json.loads((workspace / directory / name).read_text())
    except (OSError, ValueError):
        return {}


def save_state(workspace: Path, directory: str, name: str, data: dict) -> None:
    """Replace the state file ``name`` at once (a reader never sees half of it)."""
    folder = state_dir(workspace, directory)
    tmp = folder / f".{name}.part"
    files.write_private(tmp, json.dumps(data, sort_keys=True).encode())
    os.replace(tmp, folder / name)
