"""Verify MUNGE credentials with the local munged, through the ``unmunge`` binary (R-QRMI-2).

``unmunge`` is the interface every MUNGE installation ships; the Python bindings on PyPI
(``pymunge``) have not been released since 2018. One decode costs one short subprocess.

munged remembers every credential it decoded until the credential expires: a second decode of the
same credential is refused as a replay (exit 17). Callers must therefore decode a credential once
per request and keep the result (see ``authentication.MungeAuthentication``).
"""

import re
import subprocess
from dataclasses import dataclass

from django.conf import settings

PREFIX = "MUNGE:"
MAX_LENGTH = 4096  # an empty-payload credential is ~130 characters; anything huge is not one

# munge(7) error codes, as the exit status of unmunge.
EXPIRED = 15
REWOUND = 16
REPLAYED = 17
UNAUTHORIZED = 18
INVALID = frozenset({3, 8, 9, 10, 11, 12, 13, 14})  # bad length, credential, version, cipher, mac, zip, realm
REASONS = {
    EXPIRED: "expired",
    REWOUND: "rewound (its encode time is in the future)",
    REPLAYED: "replayed (already used)",
    UNAUTHORIZED: "not authorized for this server",
}


class CredentialRejected(Exception):
    """The credential is invalid, expired or replayed: the caller is not authenticated (401)."""

    def __init__(self, reason: str, code: int | None = None):
        super().__init__(reason)
        self.reason, self.code = reason, code


class MungeUnavailable(Exception):
    """munged could not be asked (not running, unmunge missing, timeout): a server fault (503)."""


@dataclass(frozen=True)
class MungeIdentity:
    """Who signed a verified credential: the calling process's uid and gid."""

    uid: int
    gid: int

    @property
    def is_service(self) -> bool:
        """R-QRMI-2: uids in GRIDGATE_MUNGE_SERVICE_UIDS (default root) act for other users."""
        return self.uid in settings.GRIDGATE_MUNGE_SERVICE_UIDS


_METADATA = re.compile(r"^(UID|GID):\s+(\d+)\s*$", re.MULTILINE)


def decode(credential: str) -> MungeIdentity:
    """Decode ``credential`` with munged. Each call consumes the credential (replay protection)."""
    credential = (credential or "").strip()
    if not credential.startswith(PREFIX) or len(credential) > MAX_LENGTH or "\n" in credential:
        raise CredentialRejected("not a MUNGE credential")
    command = [settings.GRIDGATE_MUNGE_UNMUNGE, "--numeric", "--keys=UID,GID", "--output=/dev/null"]
    if settings.GRIDGATE_MUNGE_SOCKET:
        command.append(f"--socket={settings.GRIDGATE_MUNGE_SOCKET}")
    try:
        done = subprocess.run(command, input=credential, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeUnavailable(f"cannot run unmunge: {exc}") from None
    if done.returncode == 0:
        values = dict(_METADATA.findall(done.stdout))
        if "UID" not in values or "GID" not in values:
            raise MungeUnavailable(f"unexpected unmunge output: {done.stdout[:200]!r}")
        return MungeIdentity(uid=int(values["UID"]), gid=int(values["GID"]))
    if done.returncode in REASONS:
        raise CredentialRejected(REASONS[done.returncode], done.returncode)
    if done.returncode in INVALID:
        raise CredentialRejected("invalid", done.returncode)
    # 1 (snafu), 6 (socket), 7 (timeout), …: munged is down or broken, not the client's fault.
    message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    raise MungeUnavailable(f"unmunge failed: {message}")
