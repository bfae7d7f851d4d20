"""The user pages. Thin: they call the services and selectors the API calls, and render.

Live parts (job lists, a case's status, logs and files) are small fragments that htmx reloads
while something is still moving; a fragment of a finished object stops asking. Nothing here asks a
provider while rendering: the only provider call on a GET is the launch dialog's options, fetched
when the dialog opens, with the API's caching and degradation (R-BACK-2).
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import APIException

from apps.backends.api.views import launch_options_for
from apps.cases import selectors as case_selectors
from apps.cases import services as case_services
from apps.cases import workspace
from apps.core.exceptions import ServiceError
from apps.resources.launch import launch_spec
from apps.resources.selectors import visible_classes, visible_pools
from apps.scheduling import selectors as job_selectors
from apps.scheduling import services as job_services
from apps.scheduling.drivers import DriverError
from apps.scheduling.models import UNFINISHED, Job
from apps.sessions import services as session_services
from apps.sessions.models import Session, SessionStatus
from apps.web import charts
from apps.web.forms import CaseCreateForm, JobSubmitForm, OpenSessionForm
from apps.web.selectors import bundled_examples, pool_gauges

LIVE_EVERY = "every 2s"  # htmx polling period of live fragments
LIST_LIMIT = 100
LOG_TAIL_LINES = 40
LAUNCH_OPTION_PREFIX = "launch_option:"


def error_text(exc: Exception) -> str:
    """An API or validation error in words, as the API would have said it."""
    if isinstance(exc, DjangoValidationError):
        return " ".join(exc.messages)
    detail = getattr(exc, "detail", str(exc))
    return _flatten(detail)


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return " ".join(
            f"{key}: {_flatten(value)}" if key != "non_field_errors" else _flatten(value)
            for key, value in detail.items()
        )
    if isinstance(detail, (list, tuple)):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


def _refused(request, exc: Exception, what: str) -> None:
    status = getattr(exc, "status_code", getattr(exc, "status", 400))
    messages.error(request, f"{what} refused ({status}): {error_text(exc)}")


# -- home -----------------------------------------------------------------------------------------
@login_required
@require_GET
def home(request):
    pools = list(visible_pools(request.user))
    gauges = pool_gauges(pools)
    rows = [{"pool": pool, "gauge": gauges[pool.pk]} for pool in pools]
    active = Session.objects.filter(user=request.user, status=SessionStatus.ACTIVE).count()
    return render(request, "web/home.html", {"rows": rows, "active_sessions": active})


# -- sessions -------------------------------------------------------------------------------------
def _sessions(user):
    return Session.objects.visible_to(user).select_related("user", "pool", "resource_class")


@login_required
@require_GET
def session_list(request):
    sessions = list(_sessions(request.user).order_by("-created_at", "id")[:LIST_LIMIT])
    return render(request, "web/session_list.html", {"sessions": sessions})


@login_required
@require_POST
def session_open(request):
    form = OpenSessionForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Session not opened: {error_text(DjangoValidationError(form.errors))}")
        return redirect("web:home")
    resource_class = visible_classes(request.user).filter(pk=form.cleaned_data["resource_class"]).first()
    if resource_class is None:
        messages.error(request, "Session not opened: no such class that you can use.")
        return redirect("web:home")
    try:
        admission = session_services.admit(
            user=request.user,
            resource_class=resource_class,
            slots=form.cleaned_data["slots"],
            external_id=form.cleaned_data["external_id"],
        )
    except (APIException, ServiceError) as exc:
        _refused(request, exc, "Session")
        return redirect("web:home")
    session = admission.session
    if admission.created:
        messages.success(request, f"Session opened on {resource_class} with {session.slots} slot(s).")
    else:
        messages.info(request, f"You already have this session for external id '{session.external_id}'.")
    return redirect("web:session-detail", pk=session.pk)


@login_required
@require_GET
def session_detail(request, pk):
    session = get_object_or_404(_sessions(request.user), pk=pk)
    examples = bundled_examples()
    form = JobSubmitForm(examples=examples, initial={"example": next(iter(examples), "")})
    return render(
        request,
        "web/session_detail.html",
        {"session": session, "form": form, "can_submit": session.is_active and session.user_id == request.user.pk},
    )


@login_required
@require_POST
def session_release(request, pk):
    session = get_object_or_404(_sessions(request.user), pk=pk)
    if session_services.release(session):
        messages.success(request, "Session released: its slots are free again.")
    else:
        messages.info(request, f"The session had already ended ({session.get_revocation_reason_display()}).")
    return redirect("web:session-detail", pk=session.pk)


@login_required
@require_POST
def job_submit(request, pk):
    session = get_object_or_404(job_services.session_for_submission().visible_to(request.user), pk=pk)
    form = JobSubmitForm(request.POST, request.FILES, examples=bundled_examples())
    if not form.is_valid():
        messages.error(request, f"Job refused: {error_text(DjangoValidationError(form.errors))}")
        return redirect("web:session-detail", pk=session.pk)
    try:
        job = job_services.submit_job(  # R-JOB-1 owner and status checks: the service's
            user=request.user, session=session, payload=form.cleaned_data["payload"], shots=form.cleaned_data["shots"]
        )
    except DriverError as exc:  # InvalidPayload included: the driver's own words
        messages.error(request, f"Job refused (400): {exc}")
        return redirect("web:session-detail", pk=session.pk)
    except ServiceError as exc:
        messages.error(request, f"Job refused ({exc.status}): {exc.detail}")
        return redirect("web:session-detail", pk=session.pk)
    except APIException as exc:
        _refused(request, exc, "Job")
        return redirect("web:session-detail", pk=session.pk)
    messages.success(request, f"Job {job.pk} submitted with {job.shots} shots.")
    return redirect("web:session-detail", pk=session.pk)


# -- jobs -----------------------------------------------------------------------------------------
def _jobs(user):
    queryset = Job.objects.select_related("pool", "device", "user")
    if not user.is_staff:
        queryset = queryset.filter(user=user)
    return queryset


def _job_rows(jobs: list[Job]) -> list[dict]:
    info = job_selectors.queue_info(jobs)  # constant queries for the whole list (R-JOB-4)
    return [
        {"job": job, "reason": info.get(job.pk, ("", None))[0], "position": info.get(job.pk, ("", None))[1]}
        for job in jobs
    ]


@login_required
@require_GET
def job_list(request):
    """All your jobs; with ``?session=`` one session's. htmx asks for the table alone."""
    queryset = _jobs(request.user)
    session_id = request.GET.get("session")
    if session_id:
        try:
            session_id = uuid.UUID(session_id)
        except ValueError:
            raise Http404("No such session.") from None
        queryset = queryset.filter(session__in=_sessions(request.user).filter(pk=session_id))
    jobs = list(queryset.order_by("-created_at", "-id")[:LIST_LIMIT])
    context = {
        "rows": _job_rows(jobs),
        "live": any(job.status in UNFINISHED for job in jobs),
        "refresh_url": request.get_full_path(),
        "show_session": not session_id,
    }
    if request.htmx:
        return render(request, "web/_job_table.html", context)
    return render(request, "web/job_list.html", context)


@login_required
@require_GET
def job_detail(request, pk):
    job = get_object_or_404(_jobs(request.user), pk=pk)
    reason, position = job_selectors.queue_info([job]).get(job.pk, ("", None))
    context = {
        "job": job,
        "reason": reason,
        "position": position,
        "chart": charts.counts_chart((job.result or {}).get("counts")) if job.result else None,
        "live": job.status in UNFINISHED,
    }
    template = "web/_job_live.html" if request.htmx else "web/job_detail.html"
    return render(request, template, context)


@login_required
@require_POST
def job_cancel(request, pk):
    job = get_object_or_404(_jobs(request.user), pk=pk)
    try:
        job = job_services.cancel_job(job)
    except APIException as exc:
        _refused(request, exc, "Cancellation")
    else:
        messages.success(
            request, f"Job {job.pk}: {'cancelled' if job.status == 'cancelled' else 'cancellation requested'}."
        )
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = reverse("web:job-detail", args=[job.pk])
    return redirect(target)


# -- cases ----------------------------------------------------------------------------------------
@login_required
def case_list(request):
    """Your cases (staff: all) and the form to create one."""
    if request.method == "POST":
        try:
            workspace.check_content_length(request)  # R-CASE-7: refused before the body is parsed
        except APIException as exc:
            _refused(request, exc, "Upload")
            return redirect("web:case-list")
        form = CaseCreateForm(request.POST, request.FILES, user=request.user)
        if form.is_valid():
            data = form.cleaned_data
            try:
                case = case_services.create_case(
                    owner=request.user,
                    resource_class=data["resource_class"],
                    name=data["name"],
                    command=data["command"],
                    observability_globs=data["observability_globs"],
                    uploads=data["inputs"],
                )
            except (APIException, DjangoValidationError) as exc:
                form.add_error(None, error_text(exc))
            else:
                messages.success(request, f"Case '{case.name}' created. Launch it when you are ready.")
                return redirect("web:case-detail", pk=case.pk)
        status = 400
    elif request.method == "GET":
        form, status = CaseCreateForm(user=request.user), 200
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    cases = list(case_selectors.cases_for(request.user)[:LIST_LIMIT])
    return render(request, "web/case_list.html", {"cases": cases, "form": form}, status=status)


def _case(request, pk):
    return get_object_or_404(case_selectors.cases_for(request.user), pk=pk)


def _case_live_context(case) -> dict:
    """Status, progress, log tails, files and events: the database and the local workspace only."""
    root = workspace.case_dir(case.id)
    files = workspace.list_files(root)
    groups = {"inputs": [], "live": [], "results": [], "logs": []}
    for entry in files:
        top = entry["path"].split("/", 1)[0]
        entry["url"] = reverse("case-file", kwargs={"pk": case.id, "path": entry["path"]})
        groups.get(top, groups["logs"]).append(entry)
    return {
        "case": case,
        "live": not case.is_terminal,
        "stdout": workspace.tail(root / workspace.LOGS["stdout"], LOG_TAIL_LINES),
        "stderr": workspace.tail(root / workspace.LOGS["stderr"], LOG_TAIL_LINES),
        "file_groups": [(name, groups[name]) for name in ("results", "live", "inputs", "logs")],
        "events": list(case.events.order_by("at", "id")[:200]),
    }


@login_required
@require_GET
def case_detail(request, pk):
    case = _case(request, pk)
    context = _case_live_context(case)
    template = "web/_case_live.html" if request.htmx else "web/case_detail.html"
    return render(request, template, context)


@login_required
def case_launch(request, pk):
    """GET: the launch dialog (asks the backend for its options now). POST: launch. The owner's
    alone (SPEC §7): staff see every case but do not launch other users' cases."""
    case = _case(request, pk)
    if case.owner_id != request.user.pk:
        raise PermissionDenied("Only the case's owner may launch it.")
    if request.method == "GET":
        spec = launch_spec(case.resource_class)
        body = launch_options_for(case.resource_class)
        return render(
            request,
            "web/_launch_dialog.html",
            {"case": case, "spec": spec, "answer": body, "prefix": LAUNCH_OPTION_PREFIX},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    chosen = {
        key[len(LAUNCH_OPTION_PREFIX) :]: value
        for key, value in request.POST.items()
        if key.startswith(LAUNCH_OPTION_PREFIX) and value != ""
    }
    try:
        case = case_services.launch_case(case, launch_options=chosen or None)
    except (APIException, DjangoValidationError, ServiceError) as exc:
        _refused(request, exc, "Launch")
    else:
        if case.status == "failed":
            messages.error(request, f"The backend refused the case: {case.last_error}")
        else:
            messages.success(request, f"Case launched on the {case.backend} backend ({case.remote_id}).")
    return redirect("web:case-detail", pk=case.pk)


@login_required
@require_POST
def case_cancel(request, pk):
    case = _case(request, pk)
    try:
        case_services.cancel_case(case)
    except APIException as exc:
        _refused(request, exc, "Cancellation")
    else:
        messages.success(request, "Case cancelled.")
    return redirect("web:case-detail", pk=case.pk)


@login_required
@require_POST
def case_refresh(request, pk):
    case = _case(request, pk)
    try:
        case_services.refresh_case(case)
    except APIException as exc:
        _refused(request, exc, "Refresh")
    else:
        messages.info(request, "Refresh requested: a worker is asking the backend now.")
    return redirect("web:case-detail", pk=case.pk)
