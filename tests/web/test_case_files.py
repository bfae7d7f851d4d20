"""A case's file list on the pages: any name a command can make is shown safely or counted, never a
500; the file list is its own, paginated part, never in the 2 s live fragment."""

import os

import pytest
from django.test import Client
from django.urls import reverse

from apps.cases import services as case_services
from apps.cases import workspace
from apps.cases.models import Case, CaseStatus
from apps.web import views

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}

#: names a command may give its files, and how the page shows each one
ODD_NAMES = {
    "two\nlines.txt": "two\\nlines.txt",
    "carriage\rreturn.txt": "carriage\\rreturn.txt",
    "tab\tand\x1bescape": "tab\\tand\\x1bescape",
    "report\u202etxt.exe": "report\\u202etxt.exe",  # a right-to-left override would reorder it
    "x" * 255: "x" * 255,
    "..x": "..x",
    "back\\slash": "back\\slash",
    "trailing newline\n": "trailing newline\\n",
}


def _case(owner, pool, **kwargs):
    return case_services.create_case(
        owner=owner, resource_class=pool.classes.get(), name="c", command="solve", **kwargs
    )


def client_without_raising(user) -> Client:
    """A client that sees a server error as the user would (a 500), not as an exception."""
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("name", list(ODD_NAMES), ids=lambda name: repr(name[:20]))
def test_a_file_named_with_a_newline_or_any_control_character_is_listed_and_the_page_answers_200(
    web, cases_root, owner, local_pool, name
):
    """A newline made the file's link a NoReverseMatch, a 500 on the case page."""
    case = _case(owner, local_pool)
    (workspace.case_dir(case.id) / "results" / name).write_bytes(b"odd-content")
    client = client_without_raising(owner)
    assert client.get(reverse("web:case-detail", args=[case.pk])).status_code == 200
    response = client.get(reverse("web:case-files", args=[case.pk]), **HX)
    assert response.status_code == 200
    listed = response.content.decode()
    assert f">results/{ODD_NAMES[name]}</a>" in listed  # escaped, never raw
    url = reverse("case-file", kwargs={"pk": case.pk, "path": f"results/{name}"})
    assert f'href="{url}"' in listed
    download = client.get(url)
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"odd-content"


def test_a_file_whose_name_is_not_utf8_is_counted_with_a_note_and_never_a_500(web, cases_root, owner, local_pool):
    case = _case(owner, local_pool)
    results = os.fsencode(workspace.case_dir(case.id) / "results")
    with open(os.path.join(results, b"bad\xff\xfe.bin"), "wb") as handle:
        handle.write(b"x")
    os.mkdir(os.path.join(results, b"dir\xc3"))
    with open(os.path.join(results, b"dir\xc3", b"inside.txt"), "wb") as handle:
        handle.write(b"y")
    client = client_without_raising(owner)
    assert client.get(reverse("web:case-detail", args=[case.pk])).status_code == 200
    response = client.get(reverse("web:case-files", args=[case.pk]), **HX)
    assert response.status_code == 200
    assert "2 more not listed: their names are not valid UTF-8 text" in response.content.decode()
    assert client.get(reverse("web:case-files", args=[case.pk])).status_code == 200  # the page without htmx
    # The bytes as a URL carries them: Django reads them as the text "%FF%FE", no such file.
    missing = client.get(f"/api/v1/cases/{case.pk}/files/results/bad%FF%FE.bin")
    assert missing.status_code == 404 and missing.json() == {"detail": "No such file."}


@pytest.fixture
def huge_case(cases_root, owner, local_pool):
    """A running case whose workspace holds 50 000 results and its two logs."""
    case = _case(owner, local_pool)
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING, backend="fake", remote_id="huge")
    results = workspace.case_dir(case.id) / "results"
    for step in range(50):
        directory = results / f"step{step:02d}"
        directory.mkdir()
        for i in range(1000):
            (directory / f"field_{i:04d}.vtu").touch()
    return Case.objects.get(pk=case.pk)


def test_a_50000_file_case_live_fragment_never_lists_files_and_its_files_part_is_paginated(
    web, owner, huge_case, monkeypatch
):
    walks, sized = [], []
    real_listing, real_entries = workspace.file_listing, workspace.file_entries

    def listing(root):
        walks.append(root)
        return real_listing(root)

    def entries(listing_, paths):
        paths = list(paths)
        sized.append(len(paths))
        return real_entries(listing_, paths)

    monkeypatch.setattr(workspace, "file_listing", listing)
    monkeypatch.setattr(workspace, "file_entries", entries)
    monkeypatch.setattr(workspace, "list_files", lambda root: pytest.fail("the whole workspace was listed"))
    client = web(owner)
    case_url = reverse("web:case-detail", args=[huge_case.pk])
    fragment = client.get(case_url, **HX)
    assert fragment.status_code == 200 and 'hx-trigger="every 2s"' in fragment.content.decode()
    assert client.get(case_url).status_code == 200
    assert walks == [] and "field_" not in fragment.content.decode()  # neither walked nor listed

    files_url = reverse("web:case-files", args=[huge_case.pk])
    first = client.get(files_url, **HX).content.decode()
    assert first.count("<li>") == views.FILES_PAGE_SIZE and "50002 files, 1 to 200 shown" in first
    assert "results/step00/field_0000.vtu" in first and f'{files_url}?page=2"' in first
    last = client.get(f"{files_url}?page=251", **HX).content.decode()  # the two logs come last
    assert last.count("<li>") == 2 and ">stdout.log</a>" in last and "Page 251 of 251" in last
    assert len(walks) == 2 and sized == [views.FILES_PAGE_SIZE, 2]  # one walk a request; sizes of a page only


def test_the_file_list_loads_with_the_page_and_again_when_the_case_ends(web, cases_root, owner, local_pool):
    case = _case(owner, local_pool)
    client = web(owner)
    page = client.get(reverse("web:case-detail", args=[case.pk])).content.decode()
    assert f'hx-get="{reverse("web:case-files", args=[case.pk])}" hx-trigger="load, case-ended from:body"' in page
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING)
    assert "HX-Trigger" not in client.get(reverse("web:case-detail", args=[case.pk]), **HX)
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.DONE, results_fetched=True)
    last_poll = client.get(reverse("web:case-detail", args=[case.pk]), **HX)
    assert last_poll.status_code == 286 and last_poll["HX-Trigger"] == "case-ended"


def test_other_users_case_files_are_404(web, cases_root, owner, outsider, local_pool):
    case = _case(owner, local_pool)
    assert web(outsider).get(reverse("web:case-files", args=[case.pk])).status_code == 404
