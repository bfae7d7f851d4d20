import mimetypes

from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import FormParser
from rest_framework.response import Response

from apps.cases import selectors, services, workspace
from apps.cases.api.filters import CaseFilter
from apps.cases.api.pagination import FilePagination
from apps.cases.api.renderers import AnyMediaRenderer, PlainTextRenderer
from apps.cases.api.serializers import (
    CampaignCreateSerializer,
    CampaignSerializer,
    CaseCreateSerializer,
    CaseEventSerializer,
    CaseSerializer,
    FileEntrySerializer,
    InputsSerializer,
    LaunchSerializer,
    UploadResultSerializer,
)
from apps.cases.models import Campaign, Case, CaseStatus
from apps.core.api.parsers import DepthLimitedJSONParser, NamedFilesMultiPartParser
from apps.core.api.renderers import JSONRenderer
from apps.core.idempotency import idempotent
from apps.core.text import HIDDEN_IN_NAMES

UPLOAD_PARSERS = [DepthLimitedJSONParser, NamedFilesMultiPartParser, FormParser]
CONFLICT = OpenApiResponse(description="Conflict with the case's current state; the body carries `status`.")
TOO_LARGE = OpenApiResponse(description="Upload over GRIDGATE_MAX_UPLOAD_MB (R-CASE-7); nothing was written.")


class UploadLimitMixin:
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.method == "POST":
            # R-CASE-7: refuse before the body is parsed, so nothing is written anywhere.
            workspace.check_content_length(request)


class CaseViewSet(UploadLimitMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Cases: your own (staff: all). Another user's case is 404."""

    serializer_class = CaseSerializer
    parser_classes = UPLOAD_PARSERS
    filterset_class = CaseFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return Case.objects.none()
        return selectors.cases_for(self.request.user)

    @extend_schema(request=CaseCreateSerializer, responses={201: CaseSerializer, 413: TOO_LARGE})
    def create(self, request):
        return idempotent(request, lambda: self._create(request))

    def _create(self, request):
        body = CaseCreateSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        case = services.create_case(
            owner=request.user,
            resource_class=data["resource_class"],
            name=data["name"],
            command=data["command"],
            launch_options=data.get("launch_options") or {},
            observability_globs=data.get("observability_globs") or [],
            campaign=data.get("campaign"),
            uploads=data.get("inputs") or [],
        )
        return Response(CaseSerializer(case).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=InputsSerializer, responses={201: UploadResultSerializer, 409: CONFLICT, 413: TOO_LARGE})
    @action(detail=True, methods=["post"], parser_classes=[NamedFilesMultiPartParser, FormParser])
    def inputs(self, request, pk=None):
        """R-CASE-7: add input files (multipart ``inputs``) while the case is prepared (owner only)."""
        case = self.get_object()
        services.require_owner(case, request.user, "upload its inputs")
        if case.status != CaseStatus.PREPARED:
            services.add_inputs(case, [])  # raises the 409 with the status
        body = InputsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        names = services.add_inputs(case, body.validated_data["inputs"])
        return Response({"uploaded": names}, status=status.HTTP_201_CREATED)

    @extend_schema(request=LaunchSerializer, responses={202: CaseSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def launch(self, request, pk=None):
        """R-CASE-1: record the launch and answer 202 with the case still ``prepared`` and
        ``launch_requested_at`` set; a worker uploads and submits it, then the case reads
        ``pending`` (submitted) or ``failed`` (refused, with ``last_error``)."""
        return idempotent(request, lambda: self._launch(request))

    def _launch(self, request):
        case = self.get_object()
        body = LaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        case = services.launch_case(case, user=request.user, launch_options=body.validated_data.get("launch_options"))
        return Response(CaseSerializer(case).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: CaseSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """R-CASE-6: idempotent; a case that ended meanwhile answers 409 with its real status."""
        return Response(CaseSerializer(services.cancel_case(self.get_object())).data)

    @extend_schema(request=None, responses={200: CaseSerializer, 429: OpenApiResponse(description="Throttled.")})
    @action(detail=True, methods=["post"])
    def refresh(self, request, pk=None):
        """Poll and sync this case now (throttled per case: GRIDGATE_CASE_REFRESH_SECONDS)."""
        return Response(CaseSerializer(services.refresh_case(self.get_object())).data)

    @extend_schema(responses=CaseEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        case = self.get_object()
        page = self.paginate_queryset(case.events.order_by("at", "id"))
        return self.get_paginated_response(CaseEventSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("stream", str, enum=["stdout", "stderr"], description="Default stdout."),
            OpenApiParameter("tail", int, description="Last N lines (default 200, at most 10000)."),
            OpenApiParameter(
                "offset",
                int,
                description="Instead of a tail: the log from this byte on (at most 1 MiB); the answer's "
                "`X-Log-Offset` header is the offset to ask next (follow a log as it grows).",
            ),
            OpenApiParameter(
                "X-Log-Offset",
                int,
                OpenApiParameter.HEADER,
                response=[200],
                description="With `offset`: the byte offset to ask next.",
            ),
        ],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    @action(detail=True, methods=["get"], renderer_classes=[PlainTextRenderer, JSONRenderer], filterset_class=None)
    def logs(self, request, pk=None):
        """R-CASE-5: the tail of the case's stdout or stderr, as text."""
        case = self.get_object()
        stream = request.query_params.get("stream", "stdout")
        if stream not in workspace.LOGS:
            raise ValidationError({"stream": ["Use stdout or stderr."]})
        if "offset" in request.query_params:
            try:
                offset = int(request.query_params["offset"])
            except ValueError:
                raise ValidationError({"offset": ["Must be a whole number."]}) from None
            if offset < 0 or offset > 2**62:
                raise ValidationError({"offset": ["Must be a byte offset of at least 0."]})
            text, next_offset = workspace.read_from(workspace.case_dir(case.id) / workspace.LOGS[stream], offset)
            response = HttpResponse(text, content_type="text/plain; charset=utf-8")
            response["X-Log-Offset"] = str(next_offset)
            return response
        try:
            lines = int(request.query_params.get("tail", 200))
        except ValueError:
            raise ValidationError({"tail": ["Must be a whole number."]}) from None
        lines = max(0, min(lines, 10000))
        text = workspace.tail(workspace.case_dir(case.id) / workspace.LOGS[stream], lines)
        return HttpResponse(text, content_type="text/plain; charset=utf-8")

    @extend_schema(responses=FileEntrySerializer(many=True))
    @action(detail=True, methods=["get"], url_path="files", pagination_class=FilePagination, filterset_class=None)
    def files(self, request, pk=None):
        """Workspace files ``{"path", "size"}`` (inputs, live, results, logs) in path order, a page
        at a time (a case may hold tens of thousands); ``unlisted`` counts the files whose names
        are not UTF-8 text, which are neither listed nor served."""
        case = self.get_object()
        listing = workspace.file_listing(workspace.case_dir(case.id))
        page = self.paginate_queryset(listing.paths)  # sizes are read for this page only
        self.paginator.unlisted = listing.unlisted
        return self.get_paginated_response(workspace.file_entries(listing, page))

    @extend_schema(
        parameters=[OpenApiParameter("path", str, OpenApiParameter.PATH, description="Relative to the workspace.")],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def download(self, request, pk=None, path=None):
        """R-CASE-7: one workspace file; paths leading out of the workspace are refused."""
        case = self.get_object()
        root = workspace.case_dir(case.id)
        target = workspace.confined(root, path or "")
        relative = target.relative_to(root.resolve())
        if relative.parts and relative.parts[0].startswith("."):
            raise NotFound("No such file.")
        handle = workspace.open_file(target)  # a regular file, never through a symlink (R-CASE-8)
        if handle is None:
            raise NotFound("No such file.")
        content_type = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        # The name a command chose may end with a newline, which Django's Content-Disposition
        # check lets through (its "$" matches before it) into a BadHeaderError, a 500; and a saved
        # file named with control characters helps nobody.
        filename = HIDDEN_IN_NAMES.sub("_", target.name)
        return FileResponse(handle, as_attachment=True, filename=filename, content_type=content_type)

    @extend_schema(
        responses={
            (200, "application/gzip"): OpenApiTypes.BINARY,
            404: OpenApiResponse(description="Not your case, or no such case."),
        }
    )
    @action(
        detail=True,
        methods=["get"],
        renderer_classes=[JSONRenderer, AnyMediaRenderer],
        filterset_class=None,
        pagination_class=None,
    )
    def archive(self, request, pk=None):
        """Every workspace file (inputs, live, results, logs) in one ``.tar.gz``, streamed as it
        is made: nothing is staged on the server's disk. Members are ``<case id>/<path>``."""
        case = self.get_object()
        stream = workspace.archive_stream(workspace.case_dir(case.id), str(case.id))
        response = StreamingHttpResponse(stream, content_type="application/gzip")
        response["Content-Disposition"] = f'attachment; filename="case-{case.id}.tar.gz"'
        return response


class CampaignViewSet(UploadLimitMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Campaigns: shared inputs uploaded once, seen as ``shared/`` by each case."""

    serializer_class = CampaignSerializer
    parser_classes = UPLOAD_PARSERS

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Campaign.objects.none()
        return selectors.campaigns_for(self.request.user)

    @extend_schema(request=CampaignCreateSerializer, responses={201: CampaignSerializer, 413: TOO_LARGE})
    def create(self, request):
        body = CampaignCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        campaign = services.create_campaign(
            owner=request.user, name=body.validated_data["name"], uploads=body.validated_data.get("inputs") or []
        )
        return Response(CampaignSerializer(campaign).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=InputsSerializer, responses={201: UploadResultSerializer, 409: CONFLICT, 413: TOO_LARGE})
    @action(detail=True, methods=["post"], parser_classes=[NamedFilesMultiPartParser, FormParser])
    def inputs(self, request, pk=None):
        campaign = self.get_object()
        body = InputsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(
            {"uploaded": services.add_campaign_inputs(campaign, body.validated_data["inputs"])},
            status=status.HTTP_201_CREATED,
        )
