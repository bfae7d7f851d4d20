"""The Warden-compatible QPU endpoint under ``/qrmi/<pool name>/`` (SPEC §7b).

R-QRMI-3: nothing here has state of its own. Acquire and release are ``apps.sessions.services``
admissions and releases, tasks are ``apps.scheduling.services`` jobs; this module only speaks
the wire protocol the unmodified ``qrmi`` client expects (see docs/qrmi.md): no trailing slashes,
integer job ids, string user ids, Warden's status names, results as a JSON string.
"""

import json

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.exceptions import Forbidden
from apps.qrmi.api.serializers import AcquireSerializer, TaskSerializer
from apps.qrmi.authentication import QrmiMungeAuthentication, user_for_uid
from apps.qrmi.permissions import HasMungeIdentity
from apps.resources.models import ResourcePool
from apps.resources.selectors import can_use_pool
from apps.scheduling import services as scheduling
from apps.scheduling.drivers import DriverError, get_driver
from apps.scheduling.models import Job, JobStatus
from apps.sessions import services as sessions
from apps.sessions.models import is_service_principal
from apps.sessions.selectors import slots_usage

SESSION_HEADER = "X-Warden-Session"

# Warden's status names, the only ones the client knows (anything else reads as an error).
STATUS = {
    JobStatus.PENDING: "PENDING",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.COMPLETED: "DONE",
    JobStatus.CANCELLED: "CANCELED",
    JobStatus.FAILED: "ERROR",
}


def job_body(job: Job, uid: int) -> dict:
    """The job shape of the protocol: ``results`` is a JSON *string* (Pulser parses it) or null
    while there is nothing to read."""
    results = None
    if job.status == JobStatus.COMPLETED and isinstance(job.result, dict):
        results = json.dumps({"counter": job.result.get("counts", {})})
    return {"id": job.pk, "user_id": str(uid), "status": STATUS[job.status], "results": results}


@extend_schema(exclude=True)  # a foreign protocol, documented in docs/qrmi.md, not in the API schema
class QrmiView(APIView):
    """Base: MUNGE authentication only (R-QRMI-2) and the pool named in the URL."""

    authentication_classes = [QrmiMungeAuthentication]
    permission_classes = [HasMungeIdentity]

    @property
    def pool(self) -> ResourcePool:
        if not hasattr(self, "_pool"):
            self._pool = ResourcePool.objects.filter(name=self.kwargs["pool"]).first()
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

    def usable_pool(self) -> ResourcePool:
        """The pool, if the caller may use it, like ``GET /resource-pools/{id}/slots/`` (R-POOL-8,
        §10 "QRMI routes included"): service uids see every pool (the SPANK plugin acts for
        everyone); an unlinked uid is 403 (it can use no pool); a user who may not use the pool
        gets the same 404 as an unknown pool, so a private pool's existence is not disclosed."""
        if self.is_service():
            return self.pool
        if not can_use_pool(self.caller(), self.pool):
            raise NotFound(f"No pool '{self.kwargs['pool']}'.")
        return self.pool

    def own_job(self, job_id: int) -> Job:
        """Other users' jobs are 404, like everywhere in Gridgate."""
        job = Job.objects.filter(pk=job_id, pool__name=self.kwargs["pool"], user=self.caller()).first()
        if job is None:
            raise NotFound(f"No job {job_id} of uid {self.uid} on pool '{self.kwargs['pool']}'.")
        return job


class AccessibleView(QrmiView):
    """``GET accessible``: no authentication (the client sends none)."""

    authentication_classes = []
    permission_classes = [AllowAny]

    def get(self, request, pool):
        default = "" if self.pool.is_accessible else f"Pool '{self.pool.name}' is not accessible."
        return Response(
            {"is_accessible": self.pool.is_accessible, "message": self.pool.accessibility_message or default}
        )


class SessionsView(QrmiView):
    """``POST sessions`` (acquire) and ``DELETE sessions`` with ``X-Warden-Session`` (release)."""

    def post(self, request, pool):
        """R-QRMI-1/3: admission, idempotency and 409s of R-SESS-1/2, on the pool's default class;
        201 new session, 200 the active one of the same scheduler job."""
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
        session = admission.session
        return Response(
            {
                "id": str(session.pk),
                "user_id": str(data["uid"]),
                "scheduler_job_id": session.external_id,
                "qpu_slots": session.slots,
            },
            status=status.HTTP_201_CREATED if admission.created else status.HTTP_200_OK,
        )

    def delete(self, request, pool):
        return release(self, self.session_id_from_header())


class SessionView(QrmiView):
    """``DELETE sessions/<id>`` (qrmi 0.26.4's release)."""

    def delete(self, request, pool, session_id):
        return release(self, session_id)


def release(view: QrmiView, session_id: str) -> Response:
    """R-SESS-4 through R-QRMI-1: service uids or the owner's uid; idempotent; 200 ``{"id"}``
    (the client treats 204 or an empty object as a failure)."""
    try:
        sessions.release(
            user=view.request.user, session_id=session_id, pool_name=view.kwargs["pool"], as_service=view.is_service()
        )
    except Forbidden:
        raise PermissionDenied(f"Unix uid {view.uid} may not release session {session_id}.") from None
    return Response({"id": session_id})


class JobsView(QrmiView):
    """``POST jobs`` with ``X-Warden-Session``: a job in the caller's own active session;
    ``GET jobs``: the caller's jobs on this pool, as Warden lists a uid's jobs."""

    LIST_LIMIT = 1000

    def get(self, request, pool):
        """The caller's jobs on the pool, oldest first (the newest ``LIST_LIMIT``)."""
        jobs = Job.objects.filter(pool=self.pool, user=self.caller()).order_by("-created_at", "-id")
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
        return Response({"logs": logs})


class SpecsView(QrmiView):
    """``GET qpu/specs``: the Pulser device the pool's device runs (the emulator: its configured
    ``pulser_device``), as a JSON string; its name is what sequences must target."""

    def get(self, request, pool):
        device = self.usable_pool().devices.order_by("-online", "id").first()
        if device is None:
            raise NotFound(f"Pool '{self.pool.name}' has no device.")
        return Response({"specs": json.dumps(get_driver(device.driver).specs(device))})


class SlotsView(QrmiView):
    """``GET qpu-slots``: R-SESS-6 usage with Warden's names; 404 when slots are not managed."""

    def get(self, request, pool):
        pool = self.usable_pool()
        if pool.slots_total is None:
            raise NotFound(f"Pool '{pool.name}' has no slot capacity (slots_total is not set).")
        usage = slots_usage(pool)
        return Response(
            {
                "qpu_slots_total": usage["slots_total"],
                "qpu_slots_used": usage["slots_used"],
                "qpu_slots_available": usage["slots_available"],
            }
        )
