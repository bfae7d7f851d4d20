"""Verify MUNGE credentials with the local munged, through libmunge (R-QRMI-2).

libmunge (Debian ``libmunge2``, installed with ``munge``) is called through ctypes: one
``munge_decode`` is a round trip on munged's Unix socket. The ``unmunge`` binary costs a fork and
exec per request, most of a QRMI request's time; the Python bindings on PyPI (``pymunge``) have
not been released since 2018.

munged remembers every credential it decoded until the credential expires: a second decode of the
same credential is refused as a replay (EMUNGE_CRED_REPLAYED). Callers must therefore decode a
credential once per request and keep the result (see ``authentication.MungeAuthentication``).
"""

import ctypes
import functools
from dataclasses import dataclass

from django.conf import settings

PREFIX = "MUNGE:"
MAX_LENGTH = 4096  # an empty-payload credential is ~130 characters; anything huge is not one

# munge(3) error codes (munge_err_t, also unmunge's exit statuses).
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
    """munged could not be asked (not running, libmunge missing): a server fault (503)."""


@dataclass(frozen=True)
class MungeIdentity:
    """Who signed a verified credential: the calling process's uid and gid."""

    uid: int
    gid: int

    @property
    def is_service(self) -> bool:
        """R-QRMI-2: uids in GRIDGATE_MUNGE_SERVICE_UIDS (default root) act for other users."""
        return self.uid in settings.GRIDGATE_MUNGE_SERVICE_UIDS


MUNGE_OPT_SOCKET = 8  # munge.h (0.5.x): the socket option of munge_ctx_set


@functools.cache
def _libmunge():
    """libmunge, loaded once per process, with the signatures of the calls used here."""
    try:
        lib = ctypes.CDLL(settings.GRIDGATE_MUNGE_LIBRARY, use_errno=True)
    except OSError as exc:
        raise MungeUnavailable(f"cannot load {settings.GRIDGATE_MUNGE_LIBRARY}: {exc}") from None
    lib.munge_decode.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.POINTER(ctypes.c_uint32),
    ]
    lib.munge_decode.restype = ctypes.c_int
    lib.munge_ctx_create.restype = ctypes.c_void_p
    lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
    lib.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
    lib.munge_ctx_set.restype = ctypes.c_int
    lib.munge_strerror.argtypes = [ctypes.c_int]
    lib.munge_strerror.restype = ctypes.c_char_p
    return lib


def decode(credential: str) -> MungeIdentity:
    """Decode ``credential`` with munged. Each call consumes the credential (replay protection)."""
    credential = (credential or "").strip()
    if not credential.startswith(PREFIX) or len(credential) > MAX_LENGTH or "\n" in credential or "\0" in credential:
        raise CredentialRejected("not a MUNGE credential")
    lib = _libmunge()
    ctx = None
    if settings.GRIDGATE_MUNGE_SOCKET:
        # A context per call: munge_decode writes the credential's own settings into it.
        ctx = lib.munge_ctx_create()
        if not ctx:
            raise MungeUnavailable("munge_ctx_create failed (out of memory)")
        lib.munge_ctx_set(ctx, MUNGE_OPT_SOCKET, settings.GRIDGATE_MUNGE_SOCKET.encode())
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
    try:
        # No payload is asked for (NULL buf/len): nothing is allocated that would need freeing.
        raw = credential.encode("ascii", "replace")
        code = lib.munge_decode(raw, ctx, None, None, ctypes.byref(uid), ctypes.byref(gid))
    finally:
        if ctx:
            lib.munge_ctx_destroy(ctx)
    if code == 0:
        return MungeIdentity(uid=uid.value, gid=gid.value)
    if code in REASONS:
        raise CredentialRejected(REASONS[code], code)
    if code in INVALID:
        raise CredentialRejected("invalid", code)
    # 1 (snafu), 6 (socket), 7 (timeout), …: munged is down or broken, not the client's fault.
    raise MungeUnavailable(f"munge_decode failed: {lib.munge_strerror(code).decode(errors='replace')}")
