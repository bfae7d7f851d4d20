"""The Warden-compatible QPU endpoint under ``/qrmi/<pool name>/`` (SPEC §7b).

R-QRMI-3: nothing here has state of its own. Acquire and release are ``apps.sessions.services``
admissions and releases, tasks are ``apps.scheduling.services`` jobs; this module only speaks
the wire protocol of the unmodified ``qrmi`` clients, qrmi 0.26.4 and the next (Warden's
QPU-slots branch), on the same routes (docs/qrmi.md, "The routes"): no trailing slashes, integer
job ids, string user ids, Warden's status names and fields, results as a JSON string,
validation errors as Warden's 422 ``detail`` list. A session id from ``X-Warden-Session`` is
never repeated in an answer but its own session's.
"""

import json

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import APIException, NotFound, ParseError, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.lockout import client_ip
from apps.core.api.serializers import times
from apps.core.exceptions import Forbidden
from apps.core.exceptions import NotFound as NoSuchObject
from apps.qrmi.api.serializers import AcquireSerializer, TaskSerializer
from apps.qrmi.authentication import QrmiMungeAuthentication, user_for_uid, verified_identity
from apps.qrmi.permissions import HasMungeIdentity
from apps.qrmi.selectors import uids_of
from apps.resources.models import ResourcePool
from apps.resources.selectors import can_use_pool, may_read_status
from apps.scheduling import services as scheduling
from apps.scheduling.drivers import DriverError, get_driver
from apps.scheduling.models import Job, JobStatus
from apps.scheduling.selectors import pool_status
from apps.sessions import services as sessions
from apps.sessions.models import RevocationReason, Session, is_service_principal
from apps.sessions.selectors import slots_usage

SESSION_HEADER = "X-Warden-Session"

# Warden's status names, the only ones the client knows (anything else reads as an error). A job
# dispatched to a device that has not started it yet is still PENDING, as Warden reports it.
STATUS = {
    JobStatus.PENDING: "PENDING",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.COMPLETED: "DONE",
    JobStatus.CANCELLED: "CANCELED",
    JobStatus.FAILED: "ERROR",
    JobStatus.UNKNOWN: "ERROR",  # the client stops waiting; the logs say an operator is asked
}
NO_LOGS = "There are no logs for this job"  # Warden's answer for a job without logs


def job_body(job: Job, uid: int) -> dict:
    """The job shape of the protocol (Warden's fields): ``results`` is a JSON *string* (Pulser
    parses it) or null while there is nothing to read."""
    results = None
    if job.status == JobStatus.COMPLETED and isinstance(job.result, dict):
        results = json.dumps({"counter": job.result.get("counts", {})})
    state = STATUS[job.status]
    if job.status == JobStatus.RUNNING and job.started_at is None:
        state = "PENDING"
    created_at, started_at, finished_at = times(job.created_at, job.started_at, job.finished_at)
    return {
        "id": job.pk,
        "user_id": str(uid),
        "session_id": str(job.session_id),
        "status": state,
        "results": results,
        "shots": job.shots,
        "created_at": created_at,
        "started_at": started_at,
        "ended_at": finished_at,
    }


# Warden's names for why a session ended (warden/lib/session_lifecycle.py), which its clients read:
# the same reasons as Gridgate's but for the lifetime's. ``released`` stays Gridgate's own (Warden
# ends every session it is asked to close as ``manual``; docs/qrmi.md, "Deliberate differences").
WARDEN_REASONS = {RevocationReason.MAX_LIFETIME: "max_lifetime_expired"}


def session_body(session: Session, uid: int | None) -> dict:
    """The session shape of the protocol (Warden's fields, both job id names)."""
    created_at, idle_expires_at, expires_at, revoked_at = times(
        session.created_at, session.idle_expires_at, session.expires_at, session.revoked_at
    )
    return {
        "id": str(session.pk),
        "user_id": None if uid is None else str(uid),
        "scheduler_job_id": session.external_id or None,
        "slurm_job_id": session.external_id or None,
        "qpu_slots": session.slots,
        "created_at": created_at,
        "idle_expires_at": idle_expires_at,
        "expires_at": expires_at,
        "revoked_at": revoked_at,
        "revocation_reason": WARDEN_REASONS.get(session.revocation_reason, str(session.revocation_reason)) or None,
    }


def warden_422(exc: ValidationError | ParseError) -> Response:
    """A validation error as Warden's (FastAPI's) 422 ``{"detail": [{"type", "loc", "msg"}]}``,
    without the ``input`` FastAPI adds: it would repeat what the request sent."""
    if isinstance(exc, ParseError):
        return Response({"detail": [{"type": "json_invalid", "loc": ["body"], "msg": str(exc.detail)}]}, status=422)
    errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
    detail = []
    for field, messages in errors.items():
        where = ["body"] if field == "non_field_errors" else ["body", field]
        for message in messages if isinstance(messages, list) else [messages]:
            detail.append({"type": "value_error", "loc": where, "msg": str(message)})
    return Response({"detail": detail}, status=422)


@extend_schema(exclude=True)  # a foreign protocol, documented in docs/qrmi.md, not in the API schema
class QrmiView(APIView):
    """Base: MUNGE authentication only (R-QRMI-2) and the pool named in the URL."""

    authentication_classes = [QrmiMungeAuthentication]
    permission_classes = [HasMungeIdentity]

    def handle_exception(self, exc):
        if isinstance(exc, (ValidationError, ParseError)):
            return warden_422(exc)
        return super().handle_exception(exc)

    @property
    def pool(self) -> ResourcePool:
        if not hasattr(self, "_pool"):
            self._pool = ResourcePool.objects.select_related("usage").filter(name=self.kwargs["pool"]).first()
            if self._pool is None:
                raise NotFound(f"No pool '{self.kwargs['pool']}'.")
        return self._pool

    @property
    def uid(self) -> int:
        return self.request.auth.uid

    def is_service(self) -> bool:
        """R-QRMI-2: a service uid, or a uid linked to a service principal, acts for others."""
        return self.request.auth.is_service or is_service_principal(self.request.user)

    def caller(self):
        """The user behind the credential's uid (job routes act as that user)."""
        if not self.request.user.is_authenticated:
            raise PermissionDenied(
                f"Unix uid {self.uid} is not linked to a Gridgate account; ask an administrator to set "
                "your Unix uid on your Gridgate user."
            )
        return self.request.user

    def session_id_from_header(self) -> str:
        raw = self.request.headers.get(SESSION_HEADER, "").strip()
        if not raw:
            # 403 as in Warden (an authorization failure there, not a malformed request).
            raise PermissionDenied(f"Missing '{SESSION_HEADER}' header (the session id acquire returned).")
        return raw

    def own_job(self, job_id: int) -> Job:
        """Other users' jobs are 404, like everywhere in Gridgate."""
        job = Job.objects.filter(pk=job_id, pool__name=self.kwargs["pool"], user=self.caller()).first()
        if job is None:
            raise NotFound(f"No job {job_id} of uid {self.uid} on pool '{self.kwargs['pool']}'.")
        return job


class OpenView(QrmiView):
    """The routes Warden serves without a credential (the clients and schedulers' sensors send
    none): they say how the pool is, never whose sessions or jobs it holds. A private pool's only
    to its users (by a MUNGE credential, when one is sent) and the load sensors' networks; anyone
    else gets the 404 of an unknown pool (``may_read_status``)."""

    authentication_classes = []
    permission_classes = [AllowAny]

    @property
    def pool(self) -> ResourcePool:
        pool = super().pool
        if not pool.public and not getattr(self, "_status_readable", False):
            if not may_read_status(pool, user=self._munge_user(), address=client_ip(self.request)):
                raise NotFound(f"No pool '{self.kwargs['pool']}'.")
            self._status_readable = True
        return pool

    def _munge_user(self):
        try:
            identity = verified_identity(self.request)
        except APIException:  # a bad or unverifiable credential proves nothing: anonymous
            return None
        if identity is None:
            return None
        return user_for_uid(identity.uid)


class RootView(OpenView):
    """``GET ""``: Warden's greeting."""

    def get(self, request, pool):
        return Response({"message": f"Gridgate's QPU endpoint for pool '{self.pool.name}' is operational."})


def status_fields(pool: ResourcePool) -> dict:
    """qrmi 0.25's ``status()``: online, offline or paused (calibration, maintenance) with the
    reason, busy, the pending jobs and the capacity in slots."""
    state = pool_status(pool)
    usage = slots_usage(pool)
    return {
        "status": state.status,
        "status_reason": state.reason,
        "busy": state.busy,
        "pending_job_count": state.pending_jobs,
        "qpu_slots_total": usage["slots_total"],
        "qpu_slots_used": usage["slots_used"] if usage["slots_total"] is not None else None,
        "qpu_slots_available": usage["slots_available"],
    }


class AccessibleView(OpenView):
    """``GET accessible``: ``is_accessible`` and ``message`` (qrmi 0.26.4), and the status
    fields of the next client."""

    def get(self, request, pool):
        pool = self.pool
        default = "" if pool.is_accessible else f"Pool '{pool.name}' is not accessible."
        return Response(
            {
                "is_accessible": pool.is_accessible,
                "message": pool.accessibility_message or default,
                **status_fields(pool),
            }
        )


class StatusView(QrmiView):
    """``GET status`` (service uids, as Warden's admins): the pending jobs, the running ones and
    the open sessions, with the pool's status."""

    LIMIT = 1000

    def get(self, request, pool):
        if not self.is_service():
            raise PermissionDenied(f"Unix uid {self.uid} may not read the status: only service uids do.")
        pool = self.pool
        running = list(
            Job.objects.filter(pool=pool, status=JobStatus.RUNNING).order_by("scheduled_at", "id")[: self.LIMIT]
        )
        open_sessions = list(Session.objects.active().filter(pool=pool).order_by("created_at", "id")[: self.LIMIT])
        uids = uids_of({job.user_id for job in running} | {session.user_id for session in open_sessions})

        def current(job):
            started_at, scheduled_at = times(job.started_at, job.scheduled_at)
            return {
                "id": job.pk,
                "session_id": str(job.session_id),
                "user_id": str(uids.get(job.user_id, "")),
                "started_at": started_at or scheduled_at,
                "backend_id": job.remote_id or None,
            }

        fields = status_fields(pool)
        return Response(
            {
                "pending_jobs_count": fields["pending_job_count"],
                "current_job": current(running[0]) if running else None,
                "running_jobs": [current(job) for job in running],
                "open_sessions": [session_body(session, uids.get(session.user_id)) for session in open_sessions],
                **fields,
            }
        )


class SessionsView(QrmiView):
    """``POST sessions`` (acquire) and ``DELETE sessions`` with ``X-Warden-Session`` (release)."""

    LIST_LIMIT = 1000

    def get(self, request, pool):
        """Warden's recovery list (service uids): the pool's sessions, filtered by ``user_id``
        (a uid), ``scheduler_job_id`` (or ``slurm_job_id``) and ``active`` (true/false)."""
        if not self.is_service():
            raise PermissionDenied(f"Unix uid {self.uid} may not list sessions: only service uids do.")
        listed = Session.objects.filter(pool__name=self.kwargs["pool"])
        query = request.query_params
        if query.get("user_id"):
            user = user_for_uid(_uid_or_422(query["user_id"]))
            if user is None:
                return Response([])
            listed = listed.filter(user=user)
        job = query.get("scheduler_job_id") or query.get("slurm_job_id")
        if job:
            listed = listed.filter(external_id=job)
        if query.get("active") is not None:
            listed = listed.filter(status="active" if _boolean_or_422(query["active"]) else "revoked")
        found = list(listed.order_by("-created_at", "id")[: self.LIST_LIMIT])
        uids = uids_of({session.user_id for session in found})
        return Response([session_body(session, uids.get(session.user_id)) for session in found])

    def post(self, request, pool):
        """R-QRMI-1/3: admission, idempotency and 409s of R-SESS-1/2, on the pool's default class;
        200 for a new session and for the active one of the same scheduler job alike, as Warden."""
        if not self.is_service():
            raise PermissionDenied(
                f"Unix uid {self.uid} may not acquire sessions: only service uids (the SPANK plugin or "
                "prolog running as root) acquire on behalf of users."
            )
        body = AcquireSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        user = user_for_uid(data["uid"])
        if user is None:
            raise PermissionDenied(
                f"Unix uid {data['uid']} has no Gridgate account: an administrator must link a Gridgate user "
                f"to uid {data['uid']} (its Unix uid field in the admin)."
            )
        # The pool, its default class, the user's access and the pool lock: one statement in
        # admit() (SPEC §9's budget of 4 statements); the reasons for a miss are looked up only on
        # a miss.
        try:
            admission = sessions.admit(
                user=user,
                resource_class=sessions.UsableClass(pool_name=self.kwargs["pool"]),
                slots=data["slots"],
                external_id=data["external_id"],
            )
        except sessions.NoSuchClass:
            if not can_use_pool(user, self.pool):  # self.pool: 404 for an unknown pool
                raise PermissionDenied(
                    f"User '{user.username}' (uid {data['uid']}) may not use pool '{self.pool.name}'."
                ) from None
            raise PermissionDenied(f"Pool '{self.pool.name}' has no default class to open sessions on.") from None
        return Response(session_body(admission.session, data["uid"]))

    def delete(self, request, pool):
        return release(self, self.session_id_from_header())


class SessionView(QrmiView):
    """``DELETE sessions/<id>`` (qrmi 0.26.4's release)."""

    def delete(self, request, pool, session_id):
        return release(self, session_id)


def release(view: QrmiView, session_id: str) -> Response:
    """R-SESS-4 through R-QRMI-1: service uids or the owner's uid; idempotent (the first
    ``revoked_at`` stays); 200 with the session (the client treats 204 or an empty object as a
    failure, and reads nothing but its ``id``). Neither a 404 nor a 403 repeats the id the client
    sent. The session comes from the release's own statement: its ``user_id`` is the caller's uid
    when the owner releases, and null when a service uid does (the owner's uid would cost a
    lookup that no client reads)."""
    try:
        released = sessions.release(
            user=view.request.user, session_id=session_id, pool_name=view.kwargs["pool"], as_service=view.is_service()
        )
    except Forbidden:
        raise PermissionDenied(f"Unix uid {view.uid} may not release this session: it is another user's.") from None
    except NoSuchObject:
        raise NotFound(f"No such session on pool '{view.kwargs['pool']}'.") from None
    session = released.session
    owner = view.uid if not view.request.auth.is_service and session.user_id == view.request.user.pk else None
    return Response(session_body(session, owner))


class JobsView(QrmiView):
    """``POST jobs`` with ``X-Warden-Session``: a job in the caller's own active session;
    ``GET jobs``: the caller's jobs on this pool, as Warden lists a uid's jobs."""

    LIST_LIMIT = 1000

    def get(self, request, pool):
        """The caller's jobs on the pool, oldest first (the newest ``LIST_LIMIT``). A private pool
        the caller may not use is the 404 of an unknown pool (R-POOL-8): an empty list would say
        that it exists."""
        user, pool = self.caller(), self.pool
        if not may_read_status(pool, user=user):
            raise NotFound(f"No pool '{self.kwargs['pool']}'.")
        jobs = Job.objects.filter(pool=pool, user=user).order_by("-created_at", "-id")
        return Response([job_body(job, self.uid) for job in list(jobs[: self.LIST_LIMIT])[::-1]])

    def post(self, request, pool):
        """R-QRMI-2/3: the uid must be the session owner's; then R-JOB-1 submission and fair
        scheduling like any job."""
        user = self.caller()
        session_id = self.session_id_from_header()
        body = TaskSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = scheduling.submit_job(  # R-JOB-1 owner and status checks: the service's (403)
                user=user,
                session_id=session_id,
                pool_name=self.kwargs["pool"],
                payload={"sequence": body.validated_data["sequence"]},
                shots=body.validated_data["shots"],
            )
        except DriverError as exc:
            raise ValidationError({"sequence": [str(exc)]}) from None
        except NoSuchObject:
            raise NotFound(f"No such session on pool '{self.kwargs['pool']}'.") from None
        except scheduling.NotYourSession:
            raise PermissionDenied("Session belongs to another user.") from None
        if settings.GRIDGATE_TASKS_EAGER:
            job.refresh_from_db()  # the inline dispatcher (tests, demos) may have run it already
        return Response(job_body(job, self.uid))


class JobView(QrmiView):
    def get(self, request, pool, job_id):
        return Response(job_body(self.own_job(job_id), self.uid))


class JobCancelView(QrmiView):
    def post(self, request, pool, job_id):
        """R-JOB-2: pending → CANCELED; running → stays RUNNING until the device stops; 409 when
        finished."""
        job = scheduling.cancel_job(self.own_job(job_id))
        return Response(job_body(job, self.uid))


class JobLogsView(QrmiView):
    def get(self, request, pool, job_id):
        job = self.own_job(job_id)
        logs = job.logs
        if job.error:
            logs += ("" if not logs or logs.endswith("\n") else "\n") + f"error: {job.error}\n"
        return Response({"logs": logs or NO_LOGS})


class SpecsView(OpenView):
    """``GET qpu/specs`` (open, as Warden's): the Pulser device the pool's device runs (the
    emulator: its configured ``pulser_device``; a QPU: its specs as last read), as a JSON string;
    its name is what sequences must target. A QPU's text is passed through as the QPU sent it
    (Warden does the same): re-serialized, its keys came back in the database's order."""

    def get(self, request, pool):
        device = self.pool.devices.order_by("-online", "id").first()
        if device is None:
            raise NotFound(f"Pool '{self.pool.name}' has no device.")
        return Response({"specs": get_driver(device.driver).specs_text(device)})


class SlotsView(OpenView):
    """``GET qpu-slots`` (open, as Warden's: the next client and the schedulers' load sensors send
    no credential): R-SESS-6 usage with Warden's names; 404 when slots are not managed."""

    def get(self, request, pool):
        pool = self.pool
        if pool.slots_total is None:
            raise NotFound("QPU slots are not configured.")
        usage = slots_usage(pool)
        return Response(
            {
                "qpu_slots_total": usage["slots_total"],
                "qpu_slots_used": usage["slots_used"],
                "qpu_slots_available": usage["slots_available"],
            }
        )


def _uid_or_422(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= 2**31 - 1):
        raise ValidationError({"user_id": ['A Unix uid: ASCII digits only, e.g. "1000".']})
    return int(text)


def _boolean_or_422(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false", "1", "0"):
        raise ValidationError({"active": ["true or false."]})
    return lowered in ("true", "1")
