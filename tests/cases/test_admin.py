"""The case admin: filters, events inline, file links, and the cancel action (same service as the API)."""

import pytest
from django.urls import reverse

from apps.cases import services
from apps.cases.admin import CaseAdmin
from apps.cases.models import Campaign, Case, CaseStatus
from tests.admin_forms import change_form_data
from tests.cases.conftest import drive, launched

pytestmark = pytest.mark.django_db


def test_changelist_filters_by_status(admin_client, make_case):
    make_case(name="alpha")
    response = admin_client.get("/admin/cases/case/?status__exact=prepared")
    assert response.status_code == 200 and b"alpha" in response.content
    assert b"alpha" not in admin_client.get("/admin/cases/case/?status__exact=done").content


def test_change_page_shows_events_and_links_to_files(admin_client, make_case):
    case = drive(launched(make_case()))
    response = admin_client.get(f"/admin/cases/case/{case.pk}/change/")
    assert response.status_code == 200
    body = response.content.decode()
    assert f"/api/v1/cases/{case.pk}/files/results/result.txt" in body
    assert "results fetched" in body  # the done transition's event, inline


def test_cancel_action_uses_the_cancel_service(admin_client, make_case):
    running = launched(make_case(name="running"))
    finished = drive(launched(make_case(name="finished")))
    response = admin_client.post(
        "/admin/cases/case/",
        {"action": "cancel_cases", "_selected_action": [str(running.pk), str(finished.pk)]},
        follow=True,
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "Cancelled 1 case(s)." in text and "already ended: done" in text
    assert Case.objects.get(pk=running.pk).status == CaseStatus.CANCELLED
    assert Case.objects.get(pk=finished.pk).status == CaseStatus.DONE


def test_campaign_with_unfinished_cases_cannot_be_deleted_from_the_admin(admin_client, make_case, owner):
    from apps.cases.models import Campaign

    campaign = services.create_campaign(owner=owner, name="sweep")
    make_case(campaign=campaign)
    assert admin_client.get(f"/admin/cases/campaign/{campaign.pk}/delete/").status_code == 403
    assert admin_client.post(f"/admin/cases/campaign/{campaign.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Campaign.objects.filter(pk=campaign.pk).exists()
    changelist = admin_client.get("/admin/cases/campaign/").content.decode()
    assert "delete_selected" not in changelist


def test_a_case_prepared_in_a_campaign_while_the_admin_deletes_it_keeps_the_campaign(
    admin_client, make_case, owner, monkeypatch
):
    """The delete page checks for unfinished cases, then the service checks again under the
    campaign's lock: a case prepared in the campaign in between made the service refuse, which
    the page did not expect (a 500). It now keeps the campaign and says why."""
    from apps.cases.admin import CampaignAdmin

    campaign = services.create_campaign(owner=owner, name="sweep")
    original = CampaignAdmin.get_deleted_objects

    def case_arrives(self, objs, request):  # after the page's own check, before the service's
        make_case(campaign=campaign)
        return original(self, objs, request)

    monkeypatch.setattr(CampaignAdmin, "get_deleted_objects", case_arrives)
    response = admin_client.post(f"/admin/cases/campaign/{campaign.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Not deleted: The campaign still has 1 unfinished case(s)." in response.content.decode()
    assert Campaign.objects.filter(pk=campaign.pk).exists()


def test_campaign_whose_cases_ended_is_deleted_from_the_admin(admin_client, make_case, owner):
    from apps.cases.models import Campaign

    campaign = services.create_campaign(owner=owner, name="sweep")
    case = services.cancel_case(make_case(campaign=campaign))
    response = admin_client.post(f"/admin/cases/campaign/{campaign.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Campaign.objects.filter(pk=campaign.pk).exists()
    case.refresh_from_db()
    assert case.campaign_id is None


def test_launched_case_owner_class_command_and_options_are_read_only(admin_client, make_case, member):
    """R-CASE-8: the admin cannot rewrite what a launched case ran, or as whom."""
    case = launched(make_case(command="run-solver", launch_options={"outcome": "succeed"}))
    page = admin_client.get(f"/admin/cases/case/{case.pk}/change/").content.decode()
    for name in ("owner", "resource_class", "command", "launch_options"):
        assert f'name="{name}"' not in page, name
    response = admin_client.post(
        f"/admin/cases/case/{case.pk}/change/",
        {
            "name": "renamed",
            "owner": member.pk,
            "resource_class": case.resource_class_id,
            "command": "cat /etc/shadow",
            "launch_options": '{"outcome": "fail"}',
            "observability_globs": "[]",
            "events-TOTAL_FORMS": "0",
            "events-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302
    case.refresh_from_db()
    assert case.name == "renamed"  # the editable part still saves
    assert (case.owner_id, case.command, case.launch_options) != (
        member.pk,
        "cat /etc/shadow",
        {"outcome": "fail"},
    )
    assert case.command == "run-solver" and case.launch_options == {"outcome": "succeed"}


def test_prepared_case_stays_editable_in_the_admin(admin_client, make_case):
    case = make_case()
    page = admin_client.get(f"/admin/cases/case/{case.pk}/change/").content.decode()
    assert 'name="command"' in page and 'name="owner"' in page


def test_prepared_case_launch_options_edited_in_the_admin_go_through_the_allow_list(admin_client, make_case):
    """R-BACK-6: the admin stores no option the backend does not declare (the API's one check)."""
    case = make_case(launch_options={"outcome": "succeed"})

    def post(options):
        return admin_client.post(
            f"/admin/cases/case/{case.pk}/change/",
            {
                "name": case.name,
                "owner": case.owner_id,
                "resource_class": case.resource_class_id,
                "command": case.command,
                "launch_options": options,
                "observability_globs": "[]",
                "events-TOTAL_FORMS": "0",
                "events-INITIAL_FORMS": "0",
            },
        )

    response = post('{"partition": "debug\\n#SBATCH --uid=0"}')
    assert response.status_code == 200 and "not a launch option" in response.content.decode()
    case.refresh_from_db()
    assert case.launch_options == {"outcome": "succeed"}
    assert post('{"outcome": "fail"}').status_code == 302
    case.refresh_from_db()
    assert case.launch_options == {"outcome": "fail"}


def test_a_running_case_is_not_deleted_by_the_admin_and_a_finished_ones_workspace_goes_with_it(
    admin_client, make_case, fake, django_capture_on_commit_callbacks
):
    """A case's row is what polls, cancels and charges its remote job: deleting an unfinished one
    would leave the job running at the provider, never charged. A finished case deleted takes its
    workspace with it (nothing else could reach or clean those files)."""
    from apps.cases import workspace

    running = launched(make_case(name="running"))
    assert running.status in (CaseStatus.PENDING, CaseStatus.RUNNING) and running.remote_id
    admin_client.post(f"/admin/cases/case/{running.pk}/delete/", {"post": "yes"})
    admin_client.post(
        "/admin/cases/case/", {"action": "delete_selected", "_selected_action": [str(running.pk)], "post": "yes"}
    )
    assert Case.objects.filter(pk=running.pk).exists()

    finished = drive(launched(make_case(name="finished")))
    assert finished.is_terminal and workspace.case_dir(finished.pk).exists()
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(f"/admin/cases/case/{finished.pk}/delete/", {"post": "yes"})
    assert not Case.objects.filter(pk=finished.pk).exists()
    assert not workspace.case_dir(finished.pk).exists()


def test_a_case_launched_while_the_admin_deletes_it_is_kept_and_not_logged_deleted(
    admin_client, make_case, monkeypatch, fake
):
    """The delete page checks the case is deletable, then the service deletes under the row lock:
    a launch asked for in between kept the case, and the page said it was deleted and logged it."""
    from django.contrib.admin.models import DELETION, LogEntry

    from apps.cases.admin import CaseAdmin

    case = make_case(name="cavity")
    original = CaseAdmin.log_deletions

    def launch_arrives(self, request, objs):  # after the page's own checks, before the service's
        services.launch_case(case)
        return original(self, request, objs)

    monkeypatch.setattr(CaseAdmin, "log_deletions", launch_arrives)
    response = admin_client.post(f"/admin/cases/case/{case.pk}/delete/", {"post": "yes"}, follow=True)

    assert "Not deleted: case cavity is unfinished (cancel it first)." in response.content.decode()
    assert Case.objects.filter(pk=case.pk).exists()
    assert not LogEntry.objects.filter(object_id=str(case.pk), action_flag=DELETION).exists()


def test_a_user_with_a_running_case_is_not_deleted_by_the_admin(admin_client, make_case, owner, fake):
    """Deleting a user cascades to their cases: while one runs, the admin refuses (the same rule
    as the case's own delete page), so no remote job is left running with no case to cancel it."""
    running = launched(make_case(name="running"))
    assert running.status in (CaseStatus.PENDING, CaseStatus.RUNNING)
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Case.objects.filter(pk=running.pk).exists()


def test_the_admin_never_gives_a_campaign_to_another_user(admin_client, make_case, owner, member):
    campaign = services.create_campaign(owner=owner, name="sweep")
    make_case(campaign=campaign)
    url = reverse("admin:cases_campaign_change", args=[campaign.pk])
    data = change_form_data(admin_client.get(url)) | {"owner": str(member.pk), "name": "sweep 2"}
    admin_client.post(url, data)
    campaign.refresh_from_db()
    assert (campaign.owner_id, campaign.name) == (owner.pk, "sweep 2")  # the name stays editable
    assert Campaign.objects.filter(owner=member).count() == 0


def test_cases_are_not_added_in_the_admin(admin_client, owner, local_pool):
    """A case is made by create_case: its workspace (inputs/), its 'created' event, its backend
    and R-POOL-8; the admin's add form saved the bare row, none of those."""
    response = admin_client.post(
        reverse("admin:cases_case_add"),
        {
            "name": "sneaky",
            "owner": str(owner.pk),
            "resource_class": str(local_pool.classes.get().pk),
            "command": "run",
            "launch_options": "{}",
            "observability_globs": "[]",
            "events-TOTAL_FORMS": "0",
            "events-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 403
    assert not Case.objects.filter(name="sneaky").exists()


def test_a_prepared_cases_class_never_moves_to_a_pool_its_owner_may_not_use(admin_client, make_case, private_pool):
    case = make_case()  # the owner may not use the private pool (granted to the member's group)
    url = reverse("admin:cases_case_change", args=[case.pk])
    data = change_form_data(admin_client.get(url)) | {"resource_class": str(private_pool.classes.get().pk)}
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "may not use this class&#x27;s pool (R-POOL-8)" in response.content.decode()
    case.refresh_from_db()
    assert case.resource_class.pool_id != private_pool.pk


def test_a_prepared_case_never_goes_to_an_owner_who_may_not_use_its_pool(
    admin_client, make_case, private_pool, member, owner
):
    case = make_case(user=member, resource_class=private_pool.classes.get())
    url = reverse("admin:cases_case_change", args=[case.pk])
    data = change_form_data(admin_client.get(url)) | {"owner": str(owner.pk)}
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "may not use this class&#x27;s pool (R-POOL-8)" in response.content.decode()
    case.refresh_from_db()
    assert case.owner_id == member.pk


def test_renaming_a_case_never_undoes_its_end(admin_client, make_case, monkeypatch):
    case = launched(make_case())
    assert case.status in (CaseStatus.PENDING, CaseStatus.RUNNING)
    url = reverse("admin:cases_case_change", args=[case.pk])
    data = change_form_data(admin_client.get(url)) | {"name": "renamed"}
    original = CaseAdmin.save_form

    def save_form(self, request, form, change):  # a poll pass commits between the read and the save
        obj = original(self, request, form, change)
        drive(Case.objects.get(pk=obj.pk))
        return obj

    monkeypatch.setattr(CaseAdmin, "save_form", save_form)
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    case.refresh_from_db()
    assert (case.name, case.status) == ("renamed", CaseStatus.DONE)


def test_cancel_action_is_refused_to_staff_who_may_only_view_cases(client, make_case):
    """An operator who may only look at cases (``view_case``) must not cancel other users' runs
    through the list's bulk action: it needs ``change_case``, like the change page."""
    from django.contrib.auth.models import Permission

    from tests import factories

    viewer = factories.user("case-viewer", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_case"))
    client.force_login(viewer)
    running = launched(make_case(name="running"))
    assert client.get("/admin/cases/case/").status_code == 200  # the list is theirs to read
    client.post("/admin/cases/case/", {"action": "cancel_cases", "_selected_action": [str(running.pk)]})
    assert Case.objects.get(pk=running.pk).status != CaseStatus.CANCELLED
