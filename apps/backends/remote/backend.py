"""The part of a remote provider's backend written once: a session per submission or job, the
``find``/``submit`` entry, what a failed submission means, the launch form's fallbacks (R-BACK-2)
and the ``doctor`` skeleton (R-BACK-5): SDK version → a pool configured? → the pool's own settings
→ the credential → the provider's own listings. The hooks a provider fills: docs/backends.md,
"Adding a remote provider".
"""

from __future__ import annotations

import logging
import time

from apps.backends.base import (
    BackendError,
    BackendStatus,
    Check,
    Doctor,
    ExecutionBackend,
    LaunchOptions,
    SubmitUncertain,
    require_command,
)
from apps.backends.remote.session import RemoteSession

logger = logging.getLogger(__name__)


def state_map(words: dict[str, tuple[str, ...]]):
    """The provider's state word → BackendStatus, from the ``words`` of each status; an unknown
    word is pending, never a failure (the core never moves a running case back)."""
    states = {word: status for status, listed in words.items() for word in listed}
    return lambda raw: states.get(str(raw or ""), BackendStatus.PENDING)


class RemoteBackend(ExecutionBackend):
    session_class: type[RemoteSession] = RemoteSession
    #: the per-user credential in the sealing line ("per-user <these>: …")
    per_user_words = "credentials"
    #: said after the sealing line when it passes
    per_user_checked = ""
    #: what to do when the service credential gets no token
    token_fix = ""

    # -- hooks --------------------------------------------------------------------------------
    def sdk_version(self) -> str:  # pragma: no cover - every provider fills it
        """ "<SDK> <version>"; raises BackendError when the SDK is missing."""
        raise NotImplementedError

    def doctor_pool(self, session, doctor: Doctor) -> None:
        """Checks of the pool's own settings, needing no credential."""

    def doctor_per_user(self, session, doctor: Doctor) -> None:
        """What users need to connect, beyond the sealing key."""

    def doctor_client(self, session, doctor: Doctor) -> bool:
        """A client for the service credential (asks for a token)."""
        issued = f"{session.label} issues a token for the service credential"
        return doctor.check("token", lambda: (session.client, issued)[1], fix=self.token_fix)

    def doctor_provider(self, session, doctor: Doctor) -> None:  # pragma: no cover
        """The provider's own listings (systems, profiles, projects…) under the service credential."""
        raise NotImplementedError

    def find_in(self, session, case_id: str) -> str | None:  # pragma: no cover - every provider fills it
        """The remote id of the job named after ``case_id``, or None."""
        raise NotImplementedError

    def submit_as(self, session, spec) -> str:  # pragma: no cover
        """Upload, create the job, return its remote id."""
        raise NotImplementedError

    def fixed_options(self, session) -> list:  # pragma: no cover
        """The launch options that need no provider call."""
        raise NotImplementedError

    def asked_options(self, session) -> list:  # pragma: no cover
        """The launch options as the provider answers them under the session's credential."""
        raise NotImplementedError

    # -- written once -----------------------------------------------------------------------------
    def session(self, ref) -> RemoteSession:
        """The session of a :class:`SubmitSpec` or :class:`JobRef`: its pool's remote, its owner's identity."""
        return self.session_class(ref.pool_remote, identity=ref.identity)

    def find(self, spec) -> str | None:
        return self.find_in(self.session(spec), spec.case_id)

    def submit(self, spec) -> str:
        require_command(spec)
        return self.submit_as(self.session(spec), spec)

    def launch_options(self, pool, identity=None) -> LaunchOptions:
        """Never raises. Until the user of a per-user pool connects there is no credential to ask
        with: the fixed options; when the provider cannot be asked, the answer is degraded to them
        (and therefore not cached, R-BACK-2)."""
        session = self.session_class(pool.remote_config() if pool is not None else {}, identity=identity)
        if session.per_user and identity is None:
            return LaunchOptions(options=self.fixed_options(session))
        try:
            return LaunchOptions(options=self.asked_options(session))
        except BackendError as exc:
            why = str(exc)
        except Exception as exc:  # not a BackendError: its text was never made safe to show
            why = f"{session.label} could not be asked: {type(exc).__name__}"
        return LaunchOptions(options=self.fixed_options(session), degraded=True, message=why)

    def refused_or_adopted(self, error: BackendError, status: int | None, find, spec, what: str) -> str:
        """After a failed submission: refused outright (a 4xx but 429), nothing was created and
        ``error`` stands; otherwise (no answer, a timeout, 429, a 5xx) the job may exist."""
        if status is not None and 400 <= status < 500 and status != 429:
            raise error from None
        return self.adopt_or_uncertain(find, error, spec, what)

    def adopt_or_uncertain(self, find, error, spec, what: str, *, attempts: int = 1, pause: float = 0.0) -> str:
        """After a submission that may have reached the provider (no answer, a timeout, a 5xx):
        the job ``find()`` sees under the case's name is adopted (R-CASE-1); otherwise
        :class:`SubmitUncertain`, and the core retries the launch later (its ``find`` first)."""
        for attempt in range(attempts):
            try:
                found = find()
            except BackendError:
                found = None
            if found:
                logger.info("case %s: uncertain submission (%s); adopted %s %s", spec.case_id, error, what, found)
                return found
            if attempt + 1 < attempts:
                time.sleep(pause)
        raise SubmitUncertain(f"{error}; the {what} is not listed (yet): the launch will be retried") from None

    # -- the skeleton -------------------------------------------------------------------------
    def doctor(self, pool=None) -> list[Check]:
        doctor = Doctor()
        if not doctor.check("sdk", lambda: f"{self.sdk_version()} is installed"):
            return doctor
        if pool is None:
            doctor.check("pool", lambda: f"no {self.session_class.label} pool configured: nothing more to check")
            return doctor
        session = self.session_class(pool.remote_config())
        self.doctor_pool(session, doctor)
        if session.per_user:
            doctor.check("credentials", self.sealing_check)
            self.doctor_per_user(session, doctor)
            return doctor
        credential = doctor.check("credentials", lambda: self.service_credential_check(session))
        if credential and self.doctor_client(session, doctor):
            self.doctor_provider(session, doctor)
        return doctor

    def sealing_check(self) -> tuple[bool, str]:
        from apps.credentials import sealing

        words = self.per_user_words
        if sealing.available():
            return True, f"per-user {words}: GRIDGATE_CREDENTIALS_KEY is set (value not shown){self.per_user_checked}"
        return False, (
            f"per-user {words} need GRIDGATE_CREDENTIALS_KEY (a Fernet key) on every web and worker host: "
            "users cannot connect without it"
        )

    @staticmethod
    def service_credential_check(session) -> str:
        session.service_credential()
        names = session.service_env_names()
        if len(names) == 1:
            return f"{names[0]} is set (value not shown)"
        return f"{' and '.join(map(str, names))} are set (values not shown)"
