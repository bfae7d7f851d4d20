import time

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.allocations.selectors import remaining_by_id
from apps.core.api.permissions import StaffWithModelPermissionOrReadOnly
from apps.core.idempotency import idempotent
from apps.resources.models import ResourcePool
from apps.scheduling import results, selectors, services, shares
from apps.scheduling.api.filters import DeviceFilter, JobFilter
from apps.scheduling.api.serializers import (
    DeviceSerializer,
    JobLogsSerializer,
    JobResultSerializer,
    JobSerializer,
    JobSubmitSerializer,
    ShareSerializer,
    SubmittedJobSerializer,
)
from apps.scheduling.drivers import DriverError, get_driver
from apps.scheduling.models import Device, Job
from apps.sessions.models import Session, is_service_principal


class DeviceViewSet(viewsets.ModelViewSet):
    """Devices of the pools you may use, with their load. Staff create and change them."""

    serializer_class = DeviceSerializer
    permission_classes = [StaffWithModelPermissionOrReadOnly]
    filterset_class = DeviceFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Device.objects.none()
        visible = ResourcePool.objects.visible_to(self.request.user)
        return selectors.devices_with_load(Device.objects.filter(pool__in=visible)).order_by("pool_id", "name", "id")

    def perform_destroy(self, instance):
        services.delete_device(instance)

    def perform_create(self, serializer):
        device = serializer.save()
        if device.online:
            services.set_device_online(device, True)  # R-SCHED-5: a new device is a device online, as in the admin

    def perform_update(self, serializer):
        was_online = serializer.instance.online
        device = serializer.save()
        if device.online and not was_online:
            services.set_device_online(device, True)  # R-SCHED-5: dispatch on "device back online"

    @extend_schema(responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"])
    def specs(self, request, pk=None):
        """The driver's target description (the emulator: its Pulser device as JSON)."""
        device = self.get_object()
        return Response(get_driver(device.driver).specs(device))


class CsvRenderer(BaseRenderer):
    """``text/csv`` for a job's result (``?format=csv`` or ``Accept: text/csv``)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return results.as_csv(data).encode(self.charset)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Jobs: own; staff see all. Pending jobs say why they wait and where they are in the queue."""

    serializer_class = JobSerializer
    filterset_class = JobFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        return selectors.visible_jobs(self.request.user, Job.objects.select_related("pool")).order_by(
            "-created_at", "-id"
        )

    def get_serializer(self, *args, **kwargs):
        if args and self.action in ("list", "retrieve"):
            objects = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["queue_info"] = selectors.queue_info(objects)
        return super().get_serializer(*args, **kwargs)

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return list(page) if page is not None else None

    @extend_schema(responses=JobLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        return Response({"logs": self.get_object().logs})

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format", str, enum=["json", "csv"], description="`csv`: `bitstring,count,probability` rows."
            )
        ],
        responses={
            (200, "application/json"): JobResultSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
            409: OpenApiResponse(description="No result: the job is not completed (the body carries `status`)."),
        },
    )
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, CsvRenderer], filterset_class=None)
    def result(self, request, pk=None):
        """A completed job's counts, as JSON or CSV (``?format=csv``), to download or to read in a
        script; a job without a result is a 409 with its ``status``."""
        job = self.get_object()
        data = results.result_of(job)
        extension = request.accepted_renderer.format
        response = Response(data if extension == "csv" else JobResultSerializer(data).data)
        response["Content-Disposition"] = f'inline; filename="job-{job.pk}-result.{extension}"'
        return response

    def handle_exception(self, exc):
        # Errors are JSON on every path (docs/api.md), also when the result was asked as CSV.
        request = getattr(self, "request", None)
        if getattr(getattr(request, "accepted_renderer", None), "format", None) == "csv":
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
        return super().handle_exception(exc)

    @extend_schema(
        request=None, responses={200: JobSerializer, 409: OpenApiResponse(description="Finished or already requested.")}
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """R-JOB-2: pending → cancelled; running → cancel requested; finished or repeated → 409."""
        job = services.cancel_job(self.get_object())
        return Response(JobSerializer(job, context={"queue_info": {}}).data)


class SessionJobsView(APIView):
    """``POST /sessions/{id}/jobs/``: submit a job in your active session (R-JOB-1)."""

    @extend_schema(
        request=JobSubmitSerializer,
        responses={201: SubmittedJobSerializer, 400: OpenApiResponse(), 403: OpenApiResponse()},
    )
    def post(self, request, pk):
        return idempotent(request, lambda: self._submit(request, pk))

    def _submit(self, request, pk):
        body = JobSubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            job = services.submit_job(  # R-JOB-1: owner and status are the service's checks
                user=request.user,
                session_id=pk,
                payload=body.validated_data["payload"],
                shots=body.validated_data["shots"],
                device_id=body.validated_data.get("device"),
            )
        except services.NotYourSession:
            if not is_service_principal(request.user):
                raise NotFound() from None  # other users' sessions do not exist for the caller
            raise
        except DriverError as exc:  # InvalidPayload, or a driver that cannot judge the payload
            raise ValidationError({"payload": [str(exc)]}) from None
        # pending_reason and queue_position stay null here: computing them reads the pool's queue,
        # which would double the statements of a submission; GET the job.
        data = JobSerializer(job, context={"queue_info": {}}).data
        # R-ALLOC-1: what is left of the session's allocation (null: not limited); one query, and
        # only when the session spends an allocation.
        allocation_id = getattr(job, "allocation_id", None)
        data["allocation_remaining"] = remaining_by_id([allocation_id], timezone.now()).get(allocation_id)
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=JobSerializer(many=True))
    def get(self, request, pk):
        session = get_object_or_404(Session.objects.visible_to(request.user), pk=pk)
        jobs = selectors.visible_jobs(request.user, session.jobs.select_related("pool"))
        jobs = list(jobs.order_by("created_at", "id")[:500])
        return Response(JobSerializer(jobs, many=True, context={"queue_info": selectors.queue_info(jobs)}).data)


class PoolSharesView(APIView):
    """``GET /resource-pools/{id}/shares/``: the users' or groups' shares of a usage_fair pool
    (R-SCHED-6): yours, or everyone's for staff. Empty for the other strategies."""

    @extend_schema(responses=ShareSerializer(many=True))
    def get(self, request, pk):
        pool = get_object_or_404(ResourcePool.objects.visible_to(request.user), pk=pk)
        if pool.strategy != "usage_fair":
            return Response([])
        if request.user.is_staff:
            return Response(ShareSerializer(shares.overview(pool, time.time()), many=True).data)
        mine = shares.keys_of(pool, [request.user.pk])[request.user.pk]
        views = [v for v in shares.overview(pool, time.time(), include=[mine]) if shares.key_of(v.share) == mine]
        return Response(ShareSerializer(views, many=True).data)
