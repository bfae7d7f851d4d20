"""The user pages. Thin: they call the services and selectors the API calls, and render.

Live parts (job lists, a case's status and logs) are small fragments that htmx reloads while
something is still moving; a fragment of a finished object stops asking. A case's file list is
not one of them: it may be huge, so it is loaded on its own, a page at a time. Nothing here asks a
provider while rendering: the only provider call on a GET is the launch dialog's options, fetched
when the dialog opens, with the API's caching and degradation (R-BACK-2).
"""

from __future__ import annotations

import time
import uuid

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from apps.accounting.selectors import utilization as utilization_of
from apps.accounts import selectors as token_selectors
from apps.accounts import services as token_services
from apps.allocations import selectors as allocation_selectors
from apps.backends.readiness import case_readiness
from apps.backends.services import launch_options_for
from apps.cases import selectors as case_selectors
from apps.cases import services as case_services
from apps.cases import workspace
from apps.core.exceptions import Forbidden, InvalidFields, NotFound
from apps.core.text import printable
from apps.resources.launch import launch_spec
from apps.resources.selectors import visible_classes, visible_pools
from apps.scheduling import selectors as job_selectors
from apps.scheduling import services as job_services
from apps.scheduling import shares
from apps.scheduling.models import UNFINISHED, Job
from apps.sessions import services as session_services
from apps.sessions.models import Session, SessionStatus
from apps.web import charts
from apps.web.errors import REFUSALS, Refusal, error_text, refusal, refuse
from apps.web.forms import CaseCreateForm, JobSubmitForm, OpenSessionForm, TokenCreateForm, UtilizationForm
from apps.web.selectors import bundled_examples, pool_gauges, pool_uses

LIVE_EVERY = "every 2s"  # htmx polling period of live fragments
LIST_LIMIT = 100
FILES_PAGE_SIZE = 200  # files per page of a case's file list
CASE_ENDED = "case-ended"  # htmx event of a case page's last poll: its file list reloads
LOG_TAIL_LINES = 40
LAUNCH_OPTION_PREFIX = "launch_option:"
#: htmx stops polling a fragment answered with 286 (the fragment is still swapped in): a finished
#: object's fragment stops asking even though morphing keeps the polling element in place.
STOP_POLLING = 286


def _live_status(live: bool) -> int:
    return 200 if live else STOP_POLLING


# -- home -----------------------------------------------------------------------------------------
def _home(request, refused: dict | None = None, status: int = 200):
    pools = list(visible_pools(request.user))
    gauges = pool_gauges(pools)
    uses = pool_uses(pools, request.user)
    # The pools that would take this user's work first; those that would refuse it after, saying why.
    pools.sort(key=lambda pool: not uses[pool.pk].usable)
    projects = allocation_selectors.defaults_on(request.user, [pool.pk for pool in pools], timezone.now())
    rows = [
        {"pool": pool, "gauge": gauges[pool.pk], "use": uses[pool.pk], "project": projects.get(pool.pk)}
        for pool in pools
    ]
    active = Session.objects.filter(user=request.user, status=SessionStatus.ACTIVE).count()
    context = {"rows": rows, "active_sessions": active, "refused": refused or {}}
    return render(request, "web/home.html", context, status=status)


@login_required
@require_GET
def home(request):
    return _home(request)


@login_required
@require_GET
def pool_detail(request, pk: int):
    """A pool's page: its week of reservations and maintenance (R-RES-4), with the feed URL."""
    from apps.reservations import feeds
    from apps.reservations.week import monday_of, week

    pool = get_object_or_404(visible_pools(request.user), pk=pk)
    feed = reverse("reservations:schedule-ics", kwargs={"pk": pool.pk})
    context = {
        "pool": pool,
        "week": week([pool], request.user, monday_of(request.GET.get("week"))),
        "ics_url": request.build_absolute_uri(f"{feed}?token={feeds.feed_token(request.user)}"),
    }
    return render(request, "web/pool_detail.html", context)


# -- sessions -------------------------------------------------------------------------------------
def _sessions(user):
    return Session.objects.visible_to(user).select_related("user", "pool", "resource_class", "allocation")


@login_required
@require_GET
def session_list(request):
    sessions = session_services.settle_due(list(_sessions(request.user).order_by("-created_at", "id")[:LIST_LIMIT]))
    return render(request, "web/session_list.html", {"sessions": sessions})


@login_required
@require_POST
def session_open(request):
    form = OpenSessionForm(request.POST)

    def again(answer: Refusal, status: int, at_class: bool = True):
        """The home page again, the refused class's form keeping what was typed, its message beside it
        (focused, so it is scrolled to and read out)."""
        typed = {
            "class_id": str(request.POST.get("resource_class", "")) if at_class else "",
            "slots": request.POST.get("slots", ""),
            "external_id": request.POST.get("external_id", ""),
            "text": answer.text,
            "detail": answer.detail if answer.detail != answer.text else "",
        }
        return _home(request, refused=typed, status=status)

    if not form.is_valid():
        slots_errors = form.errors.get("slots")
        text = "The session was not opened: " + (
            "the number of slots must be a whole number of at least 1 (and within the pool's size)."
            if slots_errors
            else "the form was incomplete; reload the page and try again."
        )
        # Beside the class's form when only the slots were wrong; at the top when the class itself was.
        return again(
            Refusal(text, error_text(DjangoValidationError(form.errors))), 400, "resource_class" not in form.errors
        )
    resource_class = visible_classes(request.user).filter(pk=form.cleaned_data["resource_class"]).first()
    if resource_class is None:
        return again(Refusal("The session was not opened: that class is not one you can use."), 404, at_class=False)
    try:
        admission = session_services.admit(
            user=request.user,
            resource_class=resource_class,
            slots=form.cleaned_data["slots"],
            external_id=form.cleaned_data["external_id"],
        )
    except REFUSALS as exc:
        status = getattr(exc, "status_code", None) or getattr(exc, "status", None) or 400
        return again(refusal(exc, "The session"), status)
    session = admission.session
    if admission.created:
        messages.success(request, f"Session opened on {resource_class} with {session.slots} slot(s).")
    else:
        messages.info(request, f"You already have this session for external id '{session.external_id}'.")
    return redirect("web:session-detail", pk=session.pk)


@login_required
@require_GET
def session_detail(request, pk):
    (session,) = session_services.settle_due([get_object_or_404(_sessions(request.user), pk=pk)])
    examples = bundled_examples()
    first = next(iter(examples), "")
    initial = {"example": first}
    if first and isinstance(examples[first].get("shots"), int):
        initial["shots"] = examples[first]["shots"]
    form = JobSubmitForm(examples=examples, initial=initial)
    example_shots = {name: doc.get("shots") for name, doc in examples.items() if isinstance(doc.get("shots"), int)}
    return render(
        request,
        "web/session_detail.html",
        {
            "session": session,
            "form": form,
            "example_shots": example_shots,
            "can_submit": session.is_active and session.user_id == request.user.pk,
            "next_job": job_selectors.session_waits([session]).get(session.pk),
            "share": _share(session),
            "project": _project(session),
        },
    )


def _project(session):
    """R-ALLOC-1: the allocation the session spends and what is left of it, else None."""
    if session.allocation_id is None:
        return None
    allocation = session.allocation
    return {"allocation": allocation, "summary": allocation_selectors.summary(allocation, timezone.now())}


def _share(session):
    """The share the session's user counts under on a usage_fair pool (R-SCHED-6), else None."""
    pool = session.pool
    if pool.strategy != "usage_fair":
        return None
    key = shares.keys_of(pool, [session.user_id])[session.user_id]
    return next(v for v in shares.overview(pool, time.time(), include=[key]) if shares.key_of(v.share) == key)


@login_required
@require_POST
def session_release(request, pk):
    session = get_object_or_404(_sessions(request.user), pk=pk)
    if session_services.release(user=request.user, session_id=session.pk):
        messages.success(request, "Session released: its slots are free again.")
    else:
        session.refresh_from_db()
        messages.info(request, f"The session had already ended ({session_end_words(session, request.user)}).")
    return redirect("web:session-detail", pk=session.pk)


@login_required
@require_POST
def job_submit(request, pk):
    session = get_object_or_404(_sessions(request.user), pk=pk)
    form = JobSubmitForm(request.POST, request.FILES, examples=bundled_examples())
    if not form.is_valid():
        text = "The job was not submitted: " + " ".join(
            message for errors in form.errors.values() for message in errors
        )
        messages.error(request, Refusal(text, form.detail).as_message())
        return redirect("web:session-detail", pk=session.pk)
    try:
        job = job_services.submit_job(  # R-JOB-1 owner and status checks: the service's
            user=request.user,
            session_id=session.pk,
            payload=form.cleaned_data["payload"],
            shots=form.cleaned_data["shots"],
        )
    except REFUSALS as exc:  # a driver's InvalidPayload included: its words go to the details
        session.refresh_from_db()
        if not session.is_active:  # the service refused it for that (R-JOB-1): say it as the page does
            text = (
                f"The job was not submitted: this session has ended ({session_end_words(session, request.user)}). "
                "Open a new session to submit jobs."
            )
            messages.error(request, Refusal(text, error_text(exc)).as_message())
        else:
            refuse(request, exc, "The job")
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
    return [{"job": job, "waiting": info.get(job.pk)} for job in jobs]


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
        return render(request, "web/_job_table.html", context, status=_live_status(context["live"]))
    return render(request, "web/job_list.html", context)


@login_required
@require_GET
def job_detail(request, pk):
    job = get_object_or_404(_jobs(request.user), pk=pk)
    context = {
        "job": job,
        "waiting": job_selectors.queue_info([job]).get(job.pk),
        "chart": charts.counts_chart((job.result or {}).get("counts")) if job.result else None,
        "live": job.status in UNFINISHED,
    }
    if request.htmx:
        return render(request, "web/_job_live.html", context, status=_live_status(context["live"]))
    return render(request, "web/job_detail.html", context)


@login_required
@require_POST
def job_cancel(request, pk):
    job = get_object_or_404(_jobs(request.user), pk=pk)
    try:
        job = job_services.cancel_job(job)
    except REFUSALS as exc:
        refuse(request, exc, f"Cancelling job {job.pk}")
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
        except REFUSALS as exc:
            refuse(request, exc, "The upload")
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
            except REFUSALS as exc:
                form.add_error(None, refusal(exc, "The case").text)
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


#: a case page's history: its last events
CASE_EVENTS = 200


def _case(request, pk):
    return get_object_or_404(case_selectors.cases_for(request.user), pk=pk)


def _case_live_context(case) -> dict:
    """Status, progress, log tails and events: the database and two log tails only. The files
    are not listed here: this fragment is asked for every 2 s while the case runs, and listing a
    workspace of tens of thousands of files took seconds each time. They are their own part,
    :func:`case_files`."""
    root = workspace.case_dir(case.id)
    # The newest events (a long-running case's provider notes pile up), shown oldest first; one
    # more is read to know whether older ones were left out.
    events = list(case.events.order_by("-at", "-id")[: CASE_EVENTS + 1])
    return {
        "case": case,
        "live": not case.is_terminal,
        "stdout": workspace.tail(root / workspace.LOGS["stdout"], LOG_TAIL_LINES),
        "stderr": workspace.tail(root / workspace.LOGS["stderr"], LOG_TAIL_LINES),
        "events": events[:CASE_EVENTS][::-1],
        "older_events": len(events) > CASE_EVENTS,
    }


@login_required
@require_GET
def case_detail(request, pk):
    case = _case(request, pk)
    context = _case_live_context(case)
    if request.htmx:
        response = render(request, "web/_case_live.html", context, status=_live_status(context["live"]))
        if not context["live"]:
            # The last poll: the case just ended, so its results are on disk now (R-CASE-4). The
            # file list, loaded once with the page, loads again on this event.
            response["HX-Trigger"] = CASE_ENDED
        return response
    return render(request, "web/case_detail.html", context)


@login_required
@require_GET
def case_files(request, pk):
    """The workspace's files, a page of :data:`FILES_PAGE_SIZE` at a time in path order, with the
    total: loaded with the case page, on demand and when the case ends, never with the 2 s poll.
    One walk per request (names and file types only); sizes are read for the page shown."""
    case = _case(request, pk)
    listing = workspace.file_listing(workspace.case_dir(case.id))
    page = Paginator(listing.paths, FILES_PAGE_SIZE).get_page(request.GET.get("page"))
    entries = workspace.file_entries(listing, page.object_list)
    for entry in entries:
        # The name as the command wrote it goes into the link (percent-encoded); the page shows
        # it with control characters escaped.
        entry["url"] = reverse("case-file", kwargs={"pk": case.id, "path": entry["path"]})
        entry["shown"] = printable(entry["path"])
        entry["group"] = entry["path"].split("/", 1)[0] if "/" in entry["path"] else "logs"
    context = {"case": case, "page": page, "entries": entries, "unlisted": listing.unlisted}
    return render(request, "web/_case_files.html" if request.htmx else "web/case_files.html", context)


@login_required
def case_launch(request, pk):
    """GET: the launch dialog (asks the backend for its options now). POST: launch. The owner's
    alone (SPEC §7): staff see every case but do not launch other users' cases."""
    case = _case(request, pk)
    try:
        case_services.require_owner(case, request.user, "launch it")
    except Forbidden as exc:
        raise PermissionDenied(exc.detail) from None
    if request.method == "GET":
        readiness = case_readiness(case.resource_class.pool)
        spec = launch_spec(case.resource_class)
        # A pool whose backend is not set up is not asked at all: it cannot be launched on.
        body = launch_options_for(case.resource_class, case.owner) if readiness.ready else {}
        return render(
            request,
            "web/_launch_dialog.html",
            {"case": case, "spec": spec, "answer": body, "readiness": readiness, "prefix": LAUNCH_OPTION_PREFIX},
        )
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    chosen = {
        key[len(LAUNCH_OPTION_PREFIX) :]: value
        for key, value in request.POST.items()
        if key.startswith(LAUNCH_OPTION_PREFIX) and value != ""
    }
    try:
        case = case_services.launch_case(case, user=request.user, launch_options=chosen or None)
    except REFUSALS as exc:
        refuse(request, exc, "The launch")
    else:
        # R-CASE-1: a worker uploads and submits it; this page follows it from "submitting".
        messages.success(request, f"Launch requested on the {case.backend} backend: the case is being submitted.")
    return redirect("web:case-detail", pk=case.pk)


@login_required
@require_POST
def case_cancel(request, pk):
    case = _case(request, pk)
    try:
        case_services.cancel_case(case)
    except REFUSALS as exc:
        refuse(request, exc, "Cancelling the case")
    else:
        messages.success(request, "Case cancelled.")
    return redirect("web:case-detail", pk=case.pk)


@login_required
@require_POST
def case_refresh(request, pk):
    case = _case(request, pk)
    try:
        case_services.refresh_case(case)
    except REFUSALS as exc:
        refuse(request, exc, "The refresh")
    else:
        messages.info(request, "Refresh requested: a worker is asking the backend now.")
    return redirect("web:case-detail", pk=case.pk)


# -- API tokens ----------------------------------------------------------------------------------
def _token_form(data=None) -> TokenCreateForm:
    return TokenCreateForm(
        data, default_days=token_services.default_token_days(), max_days=settings.GRIDGATE_TOKEN_MAX_DAYS
    )


@login_required
@never_cache  # the answer to a creation holds the key: no browser or proxy may keep a copy
def token_list(request):
    """Your API tokens (staff too: everyone's are in the admin) and the form to create one. The new
    key is in the answer to the creation only, rendered once and kept nowhere (not in the session,
    not in a message): reloading the page does not show it again."""
    created, status = None, 200
    if request.method == "POST":
        form = _token_form(request.POST)
        if form.is_valid():
            try:
                token, key = token_services.issue_token(
                    request.user, name=form.cleaned_data["name"], days=form.cleaned_data["expires_in_days"]
                )
            except InvalidFields as exc:  # the term's bounds (GRIDGATE_TOKEN_MAX_DAYS)
                for field, errors in exc.errors.items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                created, status, form = {"token": token, "key": key}, 201, _token_form()
        if not created:
            status = 400
    elif request.method == "GET":
        form = _token_form()
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    tokens = list(token_selectors.tokens_of(request.user)[:LIST_LIMIT])
    return render(request, "web/token_list.html", {"tokens": tokens, "form": form, "created": created}, status=status)


@login_required
@require_POST
def token_revoke(request, pk):
    try:
        token = token_services.revoke_token(request.user, pk)  # the caller's own alone
    except NotFound:
        raise Http404("No such token.") from None
    messages.success(request, f"Token {token} revoked: its key no longer works.")
    return redirect("web:token-list")


# -- operators -----------------------------------------------------------------------------------
@login_required
@require_GET
def utilization(request):
    """Staff: per-pool pictures of a period, from the accounting selector."""
    if not request.user.is_staff:
        raise PermissionDenied("The utilization charts are for staff.")
    form = UtilizationForm(request.GET or {"period": "24h"})
    if not form.is_valid():
        return render(request, "web/utilization.html", {"form": form}, status=400)
    data = form.cleaned_data
    result = utilization_of(data["start"], data["end"], pool_ids=[data["pool"].pk] if data["pool"] else None)
    panels = charts.utilization_panels(result)
    context = {
        "form": form,
        "result": result,
        "step": charts.step_text(result.step),
        "panels": [panel for panel in panels if panel.pool.active],
        "quiet": [panel.pool.name for panel in panels if not panel.pool.active],
        "breakdown": _usage_breakdown(data["start"], data["end"], data["pool"]),
    }
    return render(request, "web/utilization.html", context)


def _usage_breakdown(since, until, pool) -> list[dict]:
    """R-ACCT-1 on the utilization page: the period's charges per user, group and project (one
    query each), with the export's CSV link for the same range."""
    from urllib.parse import urlencode

    from apps.allocations.usage import usage

    pool_ids = [pool.pk] if pool else None
    out = []
    for group_by, title in (("user", "Per user"), ("group", "Per group"), ("project", "Per project")):
        query = urlencode({"group_by": group_by, "since": since.isoformat(), "until": until.isoformat()})
        out.append(
            {
                "title": title,
                "key": group_by,
                "rows": usage(since=since, until=until, group_by=group_by, period=None, pool_ids=pool_ids),
                "csv": f"{reverse('allocations:usage-export')}?{query}&format=csv",
            }
        )
    return out


def session_end_words(session, viewer) -> str:
    """How a session ended, from the viewer's side: "released by you", "revoked by an administrator"…"""
    reason = session.revocation_reason
    if reason == "released":
        return "released by you" if session.user_id == viewer.pk else f"released by {session.user.username}"
    if reason == "manual":
        return "revoked by an administrator"
    if reason == "idle_timeout":
        return "ended after being idle too long"
    if reason == "max_lifetime":
        return "ended at its maximum lifetime"
    if reason == "access":
        return "ended when access to its pool was withdrawn"
    return "ended"


class LoginView(auth_views.LoginView):
    """The login page: the identity provider's button when one is configured, the password form
    as GRIDGATE_PASSWORD_LOGIN allows (apps/accounts/backends.py refuses what it hides)."""

    def get_context_data(self, **kwargs):
        return super().get_context_data(
            oidc_enabled=bool(settings.GRIDGATE_OIDC_ISSUER),
            oidc_name=settings.GRIDGATE_OIDC_NAME,
            password_login=settings.GRIDGATE_PASSWORD_LOGIN,
            **kwargs,
        )
