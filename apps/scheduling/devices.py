"""A device's driver-dependent rules, checked in one place for the admin form and the API.

``Device.clean`` cannot run them: models never import drivers (STYLE rule 8), and the drivers
import the models. The admin's ``DeviceForm.clean`` and ``DeviceSerializer.validate`` call
:func:`validate_driver_settings` before the model's ``full_clean``, so its errors keep their
fields and messages on both; a refused ``max_concurrent_jobs`` stops there, before the model's
pasqal_qpu one-job constraint could repeat the refusal as an error with no field."""

from collections.abc import Mapping

from django.core.exceptions import ValidationError

from apps.scheduling.drivers import DriverError, get_driver
from apps.scheduling.models import Device

FIELDS = ("driver", "config", "max_concurrent_jobs")


def validate_driver_settings(data: Mapping, device: Device) -> None:
    """Raise a ``ValidationError`` keyed to ``config`` (the driver's ``validate_config``
    problems) or ``max_concurrent_jobs`` (above the driver's ``max_concurrency``).

    ``data`` holds the submitted values (the form's cleaned data, the serializer's attrs);
    ``device`` the device being changed, or a new one, whose values stand in for the fields not
    submitted (a PATCH, an inline without the field).
    """
    values = {name: data[name] if name in data else getattr(device, name) for name in FIELDS}
    try:
        driver = get_driver(values["driver"])
    except DriverError:
        return  # an unknown name: the driver field's choices refuse it
    config = {} if values["config"] is None else values["config"]
    if not isinstance(config, dict):
        return  # Device.clean refuses it ("Must be a JSON object.")
    problems = driver.validate_config(config)
    if problems:
        raise ValidationError({"config": problems})
    if driver.max_concurrency and (values["max_concurrent_jobs"] or 0) > driver.max_concurrency:
        raise ValidationError(
            {
                "max_concurrent_jobs": (
                    f"A {values['driver']} device runs at most {driver.max_concurrency} job at a time: a new job "
                    "would drop the running one."
                )
            }
        )
