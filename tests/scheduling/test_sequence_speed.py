"""Pulser validates submitted sequences with its compiled (fastjsonschema) validator."""


def test_pulser_uses_the_compiled_schema_validator():
    from pulser.json.abstract_repr import validation

    assert validation.fastjsonschema is not None, "fastjsonschema (requirements.txt) is not installed"
    assert "sequence" in validation._FAST_VALIDATORS


def test_a_devices_specs_are_parsed_once_and_shared_by_the_sequences_that_carry_them():
    """Every abstract sequence embeds its device's specs; Pulser would rebuild that device for
    each one. The parsed device is remembered by its specs' text and is the same one Pulser
    builds; forged specs under the same name are a different text and get their own device."""
    import json

    import pulser.devices
    from pulser.json.abstract_repr.deserializer import deserialize_device

    from apps.scheduling.drivers.sequences import load_sequence, pulser_deserializer
    from tests.scheduling.pulser_sequences import analog_sequence, custom_sequence

    parsed = pulser_deserializer()._deserialize_device_object
    text = analog_sequence(atoms=2)
    first = load_sequence({"sequence": text})
    before = parsed.cache_info()
    second = load_sequence({"sequence": analog_sequence(atoms=3)})
    after = parsed.cache_info()

    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert second.device is first.device
    assert first.device == deserialize_device(json.dumps(json.loads(text)["device"])) == pulser.devices.AnalogDevice
    forged = load_sequence({"sequence": custom_sequence(max_atom_num=500)})
    assert forged.device.max_atom_num == 500 and first.device.max_atom_num != 500


def test_specs_that_pulser_refuses_are_refused_every_time_not_remembered():
    import json

    import pytest

    from apps.scheduling.drivers import InvalidPayload
    from apps.scheduling.drivers.sequences import load_sequence
    from tests.scheduling.pulser_sequences import analog_sequence

    sequence = json.loads(analog_sequence())
    sequence["device"]["max_atom_num"] = -3  # passes the schema, refused by the Device itself
    for _ in range(2):
        with pytest.raises(InvalidPayload, match="Not a valid Pulser sequence"):
            load_sequence({"sequence": sequence})


def test_specs_larger_than_real_ones_are_parsed_but_not_kept(monkeypatch):
    """A client's forged specs (say, thousands of calibrated traps) would otherwise stay in
    every worker's memory until pushed out: above the size cap they live for one request."""
    from apps.scheduling.drivers import sequences
    from tests.scheduling.pulser_sequences import custom_sequence

    parsed = sequences.pulser_deserializer()._deserialize_device_object
    monkeypatch.setattr(sequences, "SPECS_KEPT_BYTES", 100)
    before = parsed.cache_info()
    first = sequences.load_sequence({"sequence": custom_sequence(max_atom_num=77)})
    second = sequences.load_sequence({"sequence": custom_sequence(max_atom_num=77)})
    assert parsed.cache_info() == before
    assert first.device == second.device and first.device is not second.device


def test_the_production_server_imports_pulser_before_its_workers_fork():
    """config/gunicorn.conf.py's when_ready runs in the master, after the preload and before the
    first fork: a worker's first submission does not wait seconds for Pulser's import."""
    import os
    import runpy
    import sys
    from unittest import mock

    from apps.scheduling.drivers.sequences import pulser_deserializer

    with mock.patch.dict(os.environ, {"PROMETHEUS_MULTIPROC_DIR": "/nonexistent-not-created"}):
        hooks = runpy.run_path("config/gunicorn.conf.py")  # reading it sets no directory up
    hooks["when_ready"](None)
    assert "pulser.json.abstract_repr.deserializer" in sys.modules
    assert hasattr(pulser_deserializer()._deserialize_device_object, "cache_info")


def _reads(monkeypatch):
    """Count Pulser's reads of a sequence (R-DEV-1's check) from here on."""
    from apps.scheduling.drivers import sequences

    reads = []
    read = sequences._read

    def counted(text):
        reads.append(text)
        return read(text)

    monkeypatch.setattr(sequences, "_read", counted)
    return reads


def test_a_sequence_that_passed_on_a_device_is_not_read_again_for_it(monkeypatch):
    """The same text sent again (Pulser's QRMI connection sends one task per job_params entry,
    each with the same sequence) skips Pulser; the device is part of what was checked."""
    import dataclasses

    import pulser.devices

    from apps.scheduling.drivers.sequences import validate_sequence
    from tests.scheduling.pulser_sequences import analog_sequence

    text = analog_sequence(atoms=4)
    reads = _reads(monkeypatch)
    for _ in range(3):
        validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu")
    assert len(reads) == 1
    validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu", max_atoms=8)
    other = dataclasses.replace(pulser.devices.AnalogDevice, max_runs=3000)
    validate_sequence({"sequence": text}, 10, other, where="emu")
    assert len(reads) == 3  # another driver limit, another device: read again


def test_a_remembered_sequence_is_still_checked_against_its_device_and_shots():
    import pulser.devices
    import pytest

    from apps.scheduling.drivers import InvalidPayload
    from apps.scheduling.drivers.sequences import validate_sequence
    from tests.scheduling.pulser_sequences import analog_sequence

    text = analog_sequence(atoms=5)
    validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu", max_atoms=10)
    with pytest.raises(InvalidPayload, match="5 atoms"):
        validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu", max_atoms=4)
    with pytest.raises(InvalidPayload, match="100000 shots"):
        validate_sequence({"sequence": text}, 100_000, pulser.devices.AnalogDevice, where="emu", max_atoms=10)


def test_a_refused_sequence_is_read_and_refused_every_time(monkeypatch):
    import pulser.devices
    import pytest

    from apps.scheduling.drivers import InvalidPayload
    from apps.scheduling.drivers.sequences import validate_sequence
    from tests.scheduling.pulser_sequences import custom_sequence

    text = custom_sequence(measured=False)
    reads = _reads(monkeypatch)
    for _ in range(2):
        with pytest.raises(InvalidPayload, match="no measurement"):
            validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu")
    assert len(reads) == 2


def test_at_most_passed_kept_outcomes_are_remembered_the_least_recently_used_forgotten(monkeypatch):
    import pulser.devices

    from apps.scheduling.drivers import sequences
    from tests.scheduling.pulser_sequences import analog_sequence

    monkeypatch.setattr(sequences, "PASSED_KEPT", 2)
    monkeypatch.setattr(sequences, "_passed", type(sequences._passed)())
    texts = [analog_sequence(atoms=n) for n in (2, 3, 4)]
    reads = _reads(monkeypatch)
    first, second, third = texts
    for text in (first, second, first, third, first):
        sequences.validate_sequence({"sequence": text}, 10, pulser.devices.AnalogDevice, where="emu")
    assert len(sequences._passed[pulser.devices.AnalogDevice]) == 2
    assert reads == [first, second, third]  # the first, used again, outlived the second


def test_a_device_no_longer_used_takes_its_remembered_outcomes_with_it():
    """A QPU's specs change (a recalibration): the device Pulser built from the old ones is
    dropped from the parsed-specs cache, and what passed on it must not keep it in memory."""
    import dataclasses
    import gc

    import pulser.devices

    from apps.scheduling.drivers import sequences
    from tests.scheduling.pulser_sequences import analog_sequence

    recalibrated = dataclasses.replace(pulser.devices.AnalogDevice, max_runs=1999)
    sequences.validate_sequence({"sequence": analog_sequence(atoms=6)}, 10, recalibrated, where="qpu")
    assert recalibrated in sequences._passed
    before = len(sequences._passed)
    del recalibrated
    gc.collect()
    assert len(sequences._passed) == before - 1


def test_a_sequence_text_with_a_lone_surrogate_is_a_400_not_a_500():
    """JSON's \\ud800 escape decodes to a lone surrogate, which UTF-8 cannot encode: the digest
    must still be taken (the check then refuses the text as Pulser does)."""
    import pulser.devices
    import pytest

    from apps.scheduling.drivers import InvalidPayload
    from apps.scheduling.drivers.sequences import validate_sequence

    with pytest.raises(InvalidPayload, match="Not a valid Pulser sequence"):
        validate_sequence({"sequence": "{\ud800"}, 10, pulser.devices.AnalogDevice, where="emu")


def test_checking_sequences_in_many_threads_at_once_leaves_the_warning_filters_as_they_were():
    # The production server checks sequences in several threads of one process; Pulser's
    # warnings are silenced around each read by swapping the process-wide filter list, and two
    # overlapping swaps would leave one thread's "ignore everything" installed for good.
    import json
    import threading
    import warnings

    from pulser.devices import AnalogDevice

    from apps.scheduling.drivers.sequences import validate_sequence
    from tests.scheduling.pulser_sequences import analog_sequence

    template = json.loads(analog_sequence())
    before = list(warnings.filters)
    start = threading.Barrier(8, timeout=120)  # a thread that fails early breaks it instead of hanging
    failures = []

    def check(worker):
        try:
            start.wait()
            for i in range(60):
                sequence = json.loads(json.dumps(template))
                sequence["operations"][0]["amplitude"]["value"] = 1.0 + worker * 1e-3 + i * 1e-6  # never seen before
                validate_sequence({"sequence": sequence}, 10, AnalogDevice, where="emu")
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)

    threads = [threading.Thread(target=check, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert warnings.filters == before
