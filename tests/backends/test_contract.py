"""The backend contract and registry, and the file helpers shared by filesystem backends."""

import pytest

from apps.backends import files, registry
from apps.backends.base import BackendState, LaunchOptions
from apps.backends.fake import FakeBackend
from apps.backends.local import LocalBackend
from apps.backends.runai import RunaiBackend
from apps.backends.slurm import SlurmBackend


def test_backend_state_refuses_a_provider_vocabulary_and_clamps_progress():
    with pytest.raises(ValueError):
        BackendState(status="COMPLETED")
    assert BackendState(status="running", progress=1.7).progress == 1.0


def test_registry_maps_pool_kinds_to_backends(settings):
    settings.GRIDGATE_CASE_BACKENDS = {"local": "local", "slurm": "slurm"}
    assert isinstance(registry.get_backend(registry.backend_name_for_kind("local")), LocalBackend)
    assert isinstance(registry.get_backend(registry.backend_name_for_kind("slurm")), SlurmBackend)
    for kind in ("runai", "firecrest", "qarnot"):
        with pytest.raises(registry.NoBackend, match="no case backend"):
            registry.backend_name_for_kind(kind)
    with pytest.raises(registry.NoBackend, match="unknown execution backend"):
        registry.get_backend("nope")
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    assert isinstance(registry.get_backend(registry.backend_name_for_kind("local")), FakeBackend)


def test_every_pool_kind_runs_cases_by_default_runai_included(settings):
    """A Run:AI pool runs cases (SPEC §6); the default mapping serves every kind."""
    settings.GRIDGATE_CASE_BACKENDS = None
    assert registry.backend_name_for_kind("runai") == "runai"
    assert isinstance(registry.get_backend("runai"), RunaiBackend)
    assert {"name": "runai", "kinds": ["runai"]} in registry.describe()


def test_launch_options_serialize_to_the_spec_shape():
    body = FakeBackend().launch_options(None).as_dict()
    assert body["degraded"] is False
    option = body["options"][0]
    # minimum/maximum: set only on range options (R-BACK-6), null on choice options
    assert set(option) == {"key", "label", "choices", "default", "minimum", "maximum"}
    assert option["minimum"] is None and option["maximum"] is None
    assert option["choices"][0] == {"value": "succeed", "label": "Succeed"}
    assert LaunchOptions(degraded=True).as_dict()["options"] == []


def test_slurm_launch_options_degrade_when_sinfo_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    answer = SlurmBackend().launch_options(None)
    assert answer.degraded and "sinfo" in answer.message


def test_log_drain_resumes_from_the_workspace_log_size_and_keeps_bytes(tmp_path):
    source, local = tmp_path / "stdout", tmp_path / "stdout.log"
    source.write_bytes(b"line 1\n\xff\xfe raw\n")
    files.drain_log(source, local, cap=1 << 20)
    assert local.read_bytes() == source.read_bytes()
    with source.open("ab") as handle:
        handle.write(b"line 3\n")
    files.drain_log(source, local, cap=1 << 20)
    assert local.read_bytes() == b"line 1\n\xff\xfe raw\nline 3\n"


def test_a_log_is_kept_up_to_its_cap_with_a_note_and_never_grows_past_it(tmp_path):
    """What a case prints past GRIDGATE_CASE_MAX_LOG_MB is not kept, and says so once."""
    source, local = tmp_path / "stdout", tmp_path / "stdout.log"
    source.write_bytes(b"x" * 3000)
    files.drain_log(source, local, cap=1000, limit=None)
    kept = local.read_bytes()
    assert kept.startswith(b"x" * 1000) and not kept.startswith(b"x" * 1001)
    assert kept[1000:] == files.truncation_note(1000)
    with source.open("ab") as handle:
        handle.write(b"more")
    files.drain_log(source, local, cap=1000, limit=None)
    files.append_log(local, b"a remote backend's delta", cap=1000)
    assert local.read_bytes() == kept


def test_progress_marker_parsing(tmp_path):
    marker = tmp_path / "progress"
    for text, expected in [("0.5", 0.5), ("2", 1.0), ("nan", None), ("-1", None), ("garbage", None)]:
        marker.write_text(text)
        assert files.read_progress(marker) == expected
