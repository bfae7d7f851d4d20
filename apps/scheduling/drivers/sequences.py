"""R-DEV-1: one check of a Pulser sequence against the device that will run it, for every driver.

The emulator, the on-premise QPU and Pasqal Cloud all take the same payload (``{"sequence":
<abstract representation>}``) and all refuse the same things with a 400 that says why: not a
sequence, built for another device, parametrized but not built, not measured, larger than the
device (atoms, duration, register geometry), or more shots than the device's ``max_runs``.
Nothing a client sends reaches ``get_measurement_basis()`` or the device unchecked, so nothing
becomes a 500 or a job that fails on the device later.
"""

import contextlib
import functools
import hashlib
import json
import threading
import warnings
import weakref
from collections import OrderedDict

from apps.core.exceptions import Unavailable
from apps.scheduling.drivers.base import InvalidPayload

DEVICES_KEPT = 32  # parsed Pulser devices kept per process: a site has a handful of device specs
SPECS_KEPT_BYTES = 64 * 1024  # real specs are ~2 KB; larger ones (forged layouts) are parsed, not kept
PASSED_KEPT = 4096  # sequences that passed, per device and process: a digest each
_patching = threading.Lock()
_passed = weakref.WeakKeyDictionary()  # Pulser device -> OrderedDict of (digest, max_atoms)
_passed_lock = threading.Lock()
_quiet_lock = threading.RLock()


@contextlib.contextmanager
def quiet_pulser():
    """Pulser's warnings silenced for the block, one thread of the process at a time.

    Pulser warns on things a client's sequence may well do (switching to the device it already
    names, deprecated fields), and a web process should not log them for every submission.
    ``warnings.catch_warnings`` swaps the process-wide filter list and puts back the one it
    saw on entry, so two threads' blocks that overlap put back each other's lists: a warning
    escaped to the server's log under bench/http_load.py's load, and an unlucky order leaves
    "ignore everything" installed for good. Pulser's reading is CPU-bound Python, which one
    process's threads run one at a time anyway (the GIL), so the lock costs no throughput
    (bench/http_load.py's sequences never sent before measure it).
    """
    with _quiet_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def pulser_deserializer():
    """Pulser's abstract-representation deserializer, set to parse each device's specs once.

    Every abstract sequence carries a full copy of its device's specs, and Pulser rebuilds and
    re-validates that device (its calibrated layouts included) for every sequence it reads, a
    good part of what R-DEV-1 costs per submission. The specs are the same few texts for every
    user of a device, and a Pulser device is a frozen dataclass, so one parsed copy per distinct
    text (its canonical JSON) is shared. Specs that Pulser refuses raise as before and are not remembered; a client that
    sends many distinct specs only pushes others out of the bounded cache, and specs larger than
    ``SPECS_KEPT_BYTES`` (forged calibrated layouts) are parsed and dropped with the request, so
    the cache holds at most ~32 x 64 KB of text and its devices. Nothing in Gridgate or Pulser's
    readers changes a parsed device (they are frozen; ``VirtualDevice.change_rydberg_level``
    would, and is called nowhere). pulser-core is pinned, and
    tests/scheduling/test_sequence_speed.py fails if this stops taking effect.
    """
    from pulser.json.abstract_repr import deserializer

    with _patching:
        if not hasattr(deserializer._deserialize_device_object, "cache_info"):
            parse = deserializer._deserialize_device_object

            @functools.lru_cache(maxsize=DEVICES_KEPT)
            def parse_text(text):
                return parse(json.loads(text))

            def parse_once(obj):
                text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
                return parse_text(text) if len(text) <= SPECS_KEPT_BYTES else parse(obj)

            parse_once.cache_info = parse_text.cache_info
            deserializer._deserialize_device_object = parse_once
    return deserializer


def sequence_text(payload) -> str:
    """The abstract representation of ``payload["sequence"]`` (object or JSON string) as text."""
    if not isinstance(payload, dict) or "sequence" not in payload:
        raise InvalidPayload('The payload must be {"sequence": <Pulser abstract representation>}.')
    raw = payload["sequence"]
    return raw if isinstance(raw, str) else json.dumps(raw)


def load_sequence(payload):
    """The Pulser sequence of ``payload["sequence"]`` (object or JSON string)."""
    return _read(sequence_text(payload))


def _read(text: str):
    deserializer = pulser_deserializer()
    try:
        with quiet_pulser():
            return deserializer.deserialize_abstract_sequence(text)
    except Exception as exc:  # pulser raises jsonschema, ValueError, TypeError, …
        raise InvalidPayload(f"Not a valid Pulser sequence: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def device_from_specs(specs):
    """A Pulser device from its abstract representation (what a QPU's ``GET /system`` gives)."""
    deserialize_device = pulser_deserializer().deserialize_device

    text = specs if isinstance(specs, str) else json.dumps(specs)
    with quiet_pulser():
        return deserialize_device(text)


def specs_problem(specs) -> str:
    """Why the pinned Pulser cannot read ``specs`` ("" when it can): a provider may report specs
    of a newer Pulser. The status pass takes such a device down with this reason, and the request
    path answers 503 with it (``provider_device``), never a 500."""
    from pulser import __version__

    try:
        device_from_specs(specs)
    except Exception as exc:  # Pulser raises what its schema, its dataclasses or json raise
        return f"Pulser {__version__} cannot read the specs the provider reports ({type(exc).__name__}: {exc})"[:500]
    return ""


def provider_device(specs, *, where: str):
    """The Pulser device of the specs a provider reported, for a request: 503 when Pulser cannot
    read them."""
    try:
        return device_from_specs(specs)
    except Exception:
        raise Unavailable(f"{where} cannot be used now: {specs_problem(specs)}") from None


def validate_sequence(payload, shots: int, device, *, where: str, max_atoms: int | None = None) -> None:
    """Check ``payload`` against the Pulser ``device`` (R-DEV-1). ``where`` names the Gridgate
    device in messages; ``max_atoms`` is an extra limit of the driver (the emulator's state space).

    A sequence that passed on this device is not read again: the check is a function of the
    sequence's text and the device alone, so its outcome is remembered, per process, under the
    text's SHA-256 digest (never the text: a sequence may be megabytes). Clients send the same
    text again as a rule: Pulser's QRMI connection submits one task per entry of a job's
    ``job_params``, each with the same sequence (runs beyond the device's ``max_runs``, or
    repeats); so do array jobs. Reading it was a third of a submission's web CPU under load
    (bench/http_load.py's ``submits`` measure what remembering it saves). Refusals are not
    remembered (their message names the Gridgate device), and the shots are checked on every
    submission. At most ``PASSED_KEPT`` per device, the least recently used forgotten first; the
    device is held weakly, so a device Pulser no longer uses (specs a QPU no longer reports,
    pushed out of ``pulser_deserializer``'s cache) takes its outcomes with it.
    """
    text = sequence_text(payload)
    key = (hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest(), max_atoms)
    if not _passed_before(device, key):
        _check(text, device, where=where, max_atoms=max_atoms)
        _remember(device, key)
    if device.max_runs and shots > device.max_runs:
        raise InvalidPayload(f"{shots} shots requested; {where} runs at most {device.max_runs} per job.")


def _passed_before(device, key) -> bool:
    with _passed_lock:
        try:
            passed = _passed.get(device)
        except TypeError:  # a device Pulser built unhashable or without weak references: never kept
            return False
        if passed is None or key not in passed:
            return False
        passed.move_to_end(key)
        return True


def _remember(device, key) -> None:
    with _passed_lock:
        try:
            passed = _passed.setdefault(device, OrderedDict())
        except TypeError:
            return
        passed[key] = None
        if len(passed) > PASSED_KEPT:
            passed.popitem(last=False)


def _check(text: str, device, *, where: str, max_atoms: int | None) -> None:
    """R-DEV-1 but the shots: everything that depends on the sequence and the device alone."""
    sequence = _read(text)
    if sequence.device.name != device.name:
        raise InvalidPayload(
            f"The sequence targets device '{sequence.device.name}'; {where} runs '{device.name}'. "
            f"Build the sequence for {device.name} (its specs: GET /api/v1/devices/<id>/specs/)."
        )
    if sequence.is_parametrized():
        names = ", ".join(sorted(sequence.declared_variables)) or "?"
        raise InvalidPayload(
            f"The sequence is parametrized (variables: {names}) and not built: "
            "call sequence.build(<values>) and send the built sequence."
        )
    if not sequence.is_measured():
        raise InvalidPayload("The sequence has no measurement: end it with sequence.measure(<basis>).")
    atoms = len(sequence.register.qubit_ids)
    limits = [n for n in (device.max_atom_num, max_atoms) if n]
    if limits and atoms > min(limits):
        raise InvalidPayload(f"The register has {atoms} atoms; {where} takes at most {min(limits)}.")
    duration = sequence.get_duration()
    if device.max_sequence_duration and duration > device.max_sequence_duration:
        raise InvalidPayload(
            f"The sequence lasts {duration} ns; {where} runs sequences of at most {device.max_sequence_duration} ns."
        )
    # The abstract representation carries its own copy of the device: a client can send a
    # sequence "for AnalogDevice" whose embedded specs allow anything. Rebuilding it on our
    # device re-checks the register geometry and every channel against the real limits.
    try:
        with quiet_pulser():
            sequence.switch_device(device, strict=True)
    except Exception as exc:
        raise InvalidPayload(f"The sequence does not fit {where}: {first_line(exc)}") from None
