"""The case admin: filters, events inline, file links, and the cancel action (same service as the API)."""

import pytest

from apps.cases import services
from apps.cases.models import Case, CaseStatus
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
