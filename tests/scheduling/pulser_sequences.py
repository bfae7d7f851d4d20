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
