"""R-CASE-7/R-CASE-8: paths from a provider's listing, and files of a command's tree, never lead
out of the workspace (no ``..``, no absolute path, no symlink followed)."""

import os

import pytest

from apps.backends import files, privileged
from apps.backends.base import BackendError
from apps.backends.remote_common import confined_target, safe_relative
from apps.backends.slurm import SlurmBackend
from tests.backends.conftest import submit_spec


def test_provider_keys_with_dotdot_or_absolute_paths_are_refused(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for key in ("../escape", "a/../../escape", "/etc/passwd", "a//b", "", "a\\..\\b", "nul\x00"):
        assert safe_relative(key) is None, key
        assert confined_target(results, key) is None, key
    assert confined_target(results, "out/x.txt") == (results / "out" / "x.txt").resolve()


def test_provider_key_through_a_symlink_in_the_workspace_is_refused(tmp_path):
    """The confinement check for paths from a provider's listing: a key that is fine as text
    but lands through a symlink already in results/ (planted, or an earlier bug) is refused."""
    results = tmp_path / "results"
    outside = tmp_path / "outside"
    results.mkdir()
    outside.mkdir()
    (results / "x").symlink_to(outside, target_is_directory=True)
    assert confined_target(results, "x/owned.txt") is None


def test_collecting_results_never_follows_links_and_live_files_never_read_a_linked_progress(tmp_path):
    """The privileged helper's ``collect`` (root, in production) over a tree the command owns."""
    case = "0b4f6c1e-2d3a-4e5f-8a9b-0c1d2e3f4a5b"
    config = privileged.Config(cases_root=str(tmp_path), service_uid=os.geteuid(), service_gid=os.getegid())
    rdir = tmp_path / case / ".run"
    work = rdir / "work"
    (work / ".gridgate").mkdir(parents=True)
    rdir.chmod(0o700)
    (rdir / "manifest.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("0.5")
    (work / "leak").symlink_to(secret)
    (work / "dir").symlink_to(tmp_path, target_is_directory=True)
    (work / ".gridgate" / "progress").symlink_to(secret)
    os.mkfifo(work / "fifo")  # a FIFO would block a naive reader forever
    (work / "real.txt").write_text("ok")
    live = tmp_path / case / "live"
    assert privileged.collect(config, {"case_id": case, "what": "live", "globs": ["*"]}) == {"copied": ["real.txt"]}
    assert not (live / ".gridgate" / "progress").exists()
    assert privileged.collect(config, {"case_id": case, "what": "results"}) == {"copied": ["real.txt"]}
    assert (tmp_path / case / "results" / "real.txt").read_text() == "ok"
    assert not work.exists()  # dropped once the results are in


def test_reading_deltas_and_progress_never_goes_through_a_symlink(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0\n")
    link = tmp_path / "stdout"
    link.symlink_to(secret)
    files.drain_log(link, tmp_path / "stdout.log", cap=1 << 20)
    assert (tmp_path / "stdout.log").read_bytes() == b""
    assert files.read_progress(link) is None


def test_a_hard_link_planted_in_the_workspace_is_never_read(tmp_path):
    """R-CASE-8: a hard link can name a file its creator could not read (protected_hardlinks off)."""
    secret = tmp_path / "root-only"
    secret.write_text("secret")
    work = tmp_path / "work"
    work.mkdir()
    os.link(secret, work / "x")
    assert privileged.open_regular(work / "x") is None
    (work / "plain").write_text("ok")
    fd = privileged.open_regular(work / "plain")
    assert fd is not None
    os.close(fd)


def _slurm_spec(tmp_path, case_id):
    workspace = tmp_path / "workspace"
    (workspace / "inputs").mkdir(parents=True, exist_ok=True)
    return submit_spec(case_id, workspace, pool_remote={"working_root": str(tmp_path / "scratch")})


#: the tests below chown a directory to another account (root only; CI runs as root)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")


@needs_root
def test_a_run_directory_planted_under_the_working_root_is_refused_not_followed(tmp_path):
    """R-CASE-8: a user who knows their case id plants ``<working_root>/<id>`` before launching:
    a symlink (to someone else's directory) is never followed — nothing is chmod-ed, created or
    deleted there — and a directory owned by another account is never adopted."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o1777)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o750)
    (victim / "work").mkdir()
    (victim / "work" / "thesis.tex").write_text("years of work")
    (scratch / "case-a").symlink_to(victim, target_is_directory=True)
    with pytest.raises(BackendError):
        SlurmBackend().submit(_slurm_spec(tmp_path, "case-a"))
    assert (victim / "work" / "thesis.tex").read_text() == "years of work"
    assert (victim.stat().st_mode & 0o777) == 0o750 and not (victim / "job.sh").exists()

    planted = scratch / "case-b"
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # a directory of another account ("nobody")
    with pytest.raises(BackendError, match="not the service's"):
        SlurmBackend().submit(_slurm_spec(tmp_path, "case-b"))
    assert not (planted / "job.sh").exists()


def test_the_services_own_run_directory_is_reused_with_its_mode(tmp_path):
    """A retried submit finds its own run directory: reused, mode reset."""
    path = tmp_path / "scratch" / "case"
    files.service_run_dir(path, 0o711)
    path.chmod(0o777)
    files.service_run_dir(path, 0o711)
    assert (path.stat().st_mode & 0o777) == 0o711


@needs_root
def test_a_working_root_others_may_write_without_the_sticky_bit_is_refused(tmp_path):
    """R-CASE-8: there anyone could rename the checked run directory away and put a symlink in its
    place before root writes through it: refused with what to fix."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chown(scratch, 65534, 65534)  # not the service's
    scratch.chmod(0o777)  # world-writable, no sticky bit
    with pytest.raises(BackendError, match="sticky"):
        files.service_run_dir(scratch / "case", 0o711)
    scratch.chmod(0o1777)  # as /scratch is: accepted
    files.service_run_dir(scratch / "case", 0o711)
    assert (scratch / "case").is_dir()
