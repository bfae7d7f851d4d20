"""What ``manage.py doctor`` checks of a FirecREST pool beyond the shared skeleton
(``apps.backends.remote.backend``): the token endpoint, the system and its health, the
partition, the working root; on a per-user pool, what users need to connect (OAuth)."""

from __future__ import annotations

from apps.backends.base import Doctor
from apps.backends.firecrest.client import Session, _sdk
from apps.backends.remote import RemoteBackend
from apps.credentials import oauth
from apps.resources.remote import authorization_endpoint, revocation_endpoint


class FirecrestDoctor(RemoteBackend):
    session_class = Session

    def sdk_version(self) -> str:
        firecrest, _ = _sdk()
        return f"pyfirecrest {firecrest.__version__}"

    def doctor_client(self, session: Session, doctor: Doctor) -> bool:
        def auth():
            try:
                session.client._authorization.get_access_token()
            except Exception as exc:
                detail = session.classify(exc).detail
                return False, session.scrub(f"no token from {session.remote.get('token_uri')}: {detail}")
            return True, "the token endpoint issued a token for these client credentials"

        return doctor.check("auth", auth)

    def doctor_provider(self, session: Session, doctor: Doctor) -> None:
        systems = []

        def reachability():
            systems.extend(session.call("system listing", "systems") or [])
            return f"{session.api_url} answers ({len(systems)} systems)"

        if doctor.check("reachability", reachability) and doctor.check("system", lambda: _system(session, systems)):
            if session.remote.get("partition"):
                doctor.check("partition", lambda: _partition(session))
            doctor.check("working_root", lambda: _working_root(session), fix="fix remote.working_root")

    def doctor_per_user(self, session: Session, doctor: Doctor) -> None:
        """No service account to ask FirecREST with: what users need to connect (the
        authorization endpoint, the public client at the token endpoint, revocation); the system,
        partition and working_root are met by the first user's case."""
        endpoint = authorization_endpoint(session.remote)
        doctor.check(
            "authorization",
            lambda: (bool(endpoint), f"users connect at {endpoint}" if endpoint else "set authorization_uri"),
        )
        doctor.check("client", lambda: oauth.probe_client(session.remote))
        doctor.check("revocation", lambda: _revocation(session))


def _system(session: Session, systems: list) -> tuple[bool, str]:
    names = [s.get("name") for s in systems]
    system = next((s for s in systems if s.get("name") == session.system), None)
    if system is None:
        offered = ", ".join(map(str, names)) or "none"
        return False, f"system {session.system!r} is not offered ({offered}): fix remote.system_name"
    # servicesHealth is a list (scheduler, ssh, filesystem…): any entry may be the sick one.
    health = system.get("servicesHealth")
    entries = [h for h in health if isinstance(h, dict)] if isinstance(health, list) else []
    sick = [h for h in entries if h.get("healthy") is False]
    if not sick:
        return True, f"system {session.system} is up ({len(entries)} service(s) healthy)"
    detail = "; ".join(
        f"{h.get('serviceType') or 'service'}" + (f" ({h['message']})" if h.get("message") else "") for h in sick
    )
    return False, session.scrub(f"system {session.system} reports unhealthy: {detail}")


def _partition(session: Session) -> tuple[bool, str]:
    partition = session.remote.get("partition")
    partitions = [p.get("name") for p in session.call("partition listing", "partitions", session.system)]
    if partition in partitions:
        return True, f"partition {partition} exists"
    return False, f"partition {partition} is not on {session.system} ({', '.join(partitions)}): fix remote.partition"


def _working_root(session: Session) -> tuple[bool, str]:
    root = session.remote.get("working_root")
    if not root:
        return False, "remote.working_root is not set: cases need it"
    session.call("working_root creation", "mkdir", session.system, root, create_parents=True)
    return True, f"{root} exists and is writable on {session.system}"


def _revocation(session: Session) -> tuple[bool, str]:
    """Disconnecting revokes the grant there (RFC 7009): a made-up token is answered 200."""
    endpoint = revocation_endpoint(session.remote)
    try:
        oauth.revoke(session.remote, "gridgate-doctor-probe")
    except oauth.OAuthError as exc:
        advice = "check revocation_uri and the public client" if endpoint else "set revocation_uri"
        return False, f"disconnecting cannot revoke users' grants: {exc}: {advice}"
    return True, f"disconnecting revokes users' grants at {endpoint}"
