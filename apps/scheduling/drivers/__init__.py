"""Device drivers: one small contract (``base``), one module per driver, one registry.

The registry names each driver by its dotted path and imports it when asked for (STYLE rule 8,
as the execution backends' registry): this package imports none of its drivers, so a driver
may import what it needs (the status pass, the models) without an import circle.
"""

from django.utils.module_loading import import_string

from apps.scheduling.drivers.base import (
    DeviceDriver,
    DriverError,
    DriverState,
    InvalidPayload,
    PermanentDriverError,
    ProviderStatus,
    SubmissionPending,
    TransientDriverError,
    UndecidedSubmission,
)

__all__ = [
    "DeviceDriver",
    "DriverError",
    "DriverState",
    "InvalidPayload",
    "PermanentDriverError",
    "ProviderStatus",
    "SubmissionPending",
    "TransientDriverError",
    "UndecidedSubmission",
    "get_driver",
]

DRIVERS = {
    "fake": "apps.scheduling.drivers.fake.FakeDriver",
    "emulator": "apps.scheduling.drivers.emulator.EmulatorDriver",
    "pasqal_qpu": "apps.scheduling.drivers.pasqal_qpu.PasqalQpuDriver",
    "pasqal_cloud": "apps.scheduling.drivers.pasqal_cloud.PasqalCloudDriver",
}


def get_driver(name: str) -> DeviceDriver:
    try:
        path = DRIVERS[name]
    except KeyError:
        raise PermanentDriverError(f"Unknown device driver '{name}'.") from None
    return import_string(path)()
