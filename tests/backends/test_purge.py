"""The ``purge`` verb of the backend contract (SPEC §8, ``manage.py cleanup``) for the backends
with no HTTP double: idempotent, and a no-op where nothing is kept remotely. FirecREST, Qarnot and
Run:AI are covered against their doubles in test_remote_contract.py."""

from apps.backends.base import JobRef
from apps.backends.local import LocalBackend
from apps.backends.slurm import SlurmBackend

CASE = "5e1f0c2a-7b3d-4c8e-9f10-2a3b4c5d6e7f"  # the privileged helper takes case ids only as UUIDs


def test_slurm_purge_removes_the_run_directory_under_working_root_idempotently(tmp_path):
    root = tmp_path / "scratch"
    run_dir = root / CASE / "work"
    run_dir.mkdir(parents=True)
    (run_dir / "out.txt").write_text("x")
    job = JobRef(CASE, "4242", tmp_path / "workspace", {"working_root": str(root)})
    SlurmBackend().purge(job)
    assert not (root / CASE).exists() and root.is_dir()
    SlurmBackend().purge(job)  # already gone: no error


def test_default_purge_is_a_no_op(tmp_path):
    (tmp_path / "keep").write_text("x")
    LocalBackend().purge(JobRef(CASE, "", tmp_path, {}))
    assert (tmp_path / "keep").exists()
