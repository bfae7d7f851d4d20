"""A case's files as one streamed ``.tar.gz`` (``GET /cases/{id}/archive/``) and its logs read from
a byte offset (``?offset=``, what ``gridgate case logs -f`` follows)."""

import io
import os
import tarfile

import pytest

from apps.cases import workspace

pytestmark = pytest.mark.django_db


def archive_of(response) -> tarfile.TarFile:
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    return tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)), mode="r:gz")


def test_the_archive_holds_every_listed_file_under_the_case_id(api, owner, make_case):
    case = make_case()
    root = workspace.case_dir(case.id)
    (root / "inputs" / "mesh.txt").write_text("mesh")
    (root / "results" / "deep" / "dir").mkdir(parents=True)
    (root / "results" / "deep" / "dir" / "out.bin").write_bytes(os.urandom(300_000))
    (root / ".run").mkdir()
    (root / ".run" / "state").write_text("hidden")  # backend state: never listed, never archived
    os.symlink("/etc/passwd", root / "results" / "passwd")  # R-CASE-8: never followed

    tar = archive_of(api(owner).get(f"/api/v1/cases/{case.id}/archive/"))

    names = sorted(tar.getnames())
    assert names == sorted(f"{case.id}/{path}" for path in workspace.file_listing(root).paths)
    assert f"{case.id}/inputs/mesh.txt" in names and f"{case.id}/results/passwd" not in names
    assert not any(".run" in name for name in names)
    data = tar.extractfile(f"{case.id}/results/deep/dir/out.bin").read()
    assert data == (root / "results" / "deep" / "dir" / "out.bin").read_bytes()


def test_the_archive_is_sent_in_chunks_not_built_whole(api, owner, make_case):
    case = make_case()
    for i in range(3):
        (workspace.case_dir(case.id) / "results" / f"f{i}").write_bytes(os.urandom(workspace.ARCHIVE_CHUNK * 2))

    response = api(owner).get(f"/api/v1/cases/{case.id}/archive/")

    assert response.streaming
    assert len(list(response.streaming_content)) > 6


def test_another_users_case_archive_is_404(api, member, make_case):
    assert api(member).get(f"/api/v1/cases/{make_case().id}/archive/").status_code == 404


def test_the_case_page_offers_download_all(owner, make_case, client):
    case = make_case()
    client.force_login(owner)
    page = client.get(f"/cases/{case.id}/").content.decode()
    assert f"/api/v1/cases/{case.id}/archive/" in page and f"gridgate case wait {case.id}" in page


def test_logs_from_an_offset_return_what_follows_and_where_to_go_on(api, owner, make_case):
    case = make_case()
    log = workspace.case_dir(case.id) / "stdout.log"
    log.write_bytes("first\nsecond é".encode()[:-1])  # the é cut in the middle, as while being written
    client = api(owner)

    first = client.get(f"/api/v1/cases/{case.id}/logs/?offset=0")
    assert first.content.decode() == "first\nsecond "
    offset = int(first["X-Log-Offset"])
    assert offset == len(b"first\nsecond ")

    with log.open("ab") as handle:
        handle.write("é".encode()[1:] + b"\nthird\n")
    second = client.get(f"/api/v1/cases/{case.id}/logs/?offset={offset}")
    assert second.content.decode() == "é\nthird\n"
    end = int(second["X-Log-Offset"])
    assert end == log.stat().st_size
    third = client.get(f"/api/v1/cases/{case.id}/logs/?offset={end}")
    assert (third.content, int(third["X-Log-Offset"])) == (b"", end)


@pytest.mark.parametrize("offset", ["-1", "x", "1e3"])
def test_a_bad_offset_is_400(api, owner, make_case, offset):
    answer = api(owner).get(f"/api/v1/cases/{make_case().id}/logs/?offset={offset}", HTTP_ACCEPT="application/json")
    assert answer.status_code == 400 and "offset" in answer.json()
