"""Small real Pulser sequences, built with pulser-core, as abstract representations."""


def analog_sequence(atoms: int = 2, device_name: str = "AnalogDevice") -> str:
    import pulser.devices
    from pulser import Pulse, Register, Sequence

    device = getattr(pulser.devices, device_name)
    register = Register.rectangle(1, atoms, spacing=8, prefix="q")
    sequence = Sequence(register, device)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(500, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()


def custom_sequence(
    *, measured=True, parametrized=False, duration=500, rows=1, columns=2, device_name="AnalogDevice", **limits
) -> str:
    """A sequence with the given defects, for R-DEV-1 tests; ``limits`` loosen the device the
    client builds it with (a forged copy under the same name), as a hostile client could."""
    import dataclasses

    import pulser.devices
    from pulser import Pulse, Register, Sequence

    device = getattr(pulser.devices, device_name)
    if limits:
        device = dataclasses.replace(device, **limits)
    sequence = Sequence(Register.rectangle(rows, columns, spacing=6, prefix="q"), device)
    sequence.declare_channel("rydberg", "rydberg_global")
    amplitude = sequence.declare_variable("omega") if parametrized else 2.0
    sequence.add(Pulse.ConstantPulse(duration, amplitude, 0.0, 0.0), "rydberg")
    if measured:
        sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()
