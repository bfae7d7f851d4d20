"""Measured device times (R-JOB-5): what a job is expected to take on a device, from the jobs
that device completed, per shots band.

A QPU's time grows with the shots asked for, and its overhead (loading the register, calibration
between batches) with neither: the band groups jobs whose times are comparable, the number of
decimal digits of ``shots`` (1–9, 10–99, …). A band with too few jobs yet falls back to the
device's jobs of every band, then to ``GRIDGATE_JOB_SECONDS_GUESS``. The moments are running
means with their weight capped at ``WINDOW`` jobs, so a device that gets faster or slower is
followed within a few hundred jobs.
"""

import math
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from apps.scheduling.models import DeviceRuntime

WINDOW = 200  # jobs: the weight of the running moments is capped here
MIN_JOBS = 3  # a band's own figures are used from this many jobs on
ALL_BANDS = -1


def band(shots: int) -> int:
    return len(str(max(int(shots), 1))) - 1


@dataclass(frozen=True)
class Estimate:
    """Expected device time in seconds and its standard deviation."""

    mean: float
    std: float

    @property
    def var(self) -> float:
        return self.std * self.std

    def remaining(self, elapsed: float) -> "Estimate":
        """What is left of a job that has run ``elapsed`` seconds: its mean residual life, with
        device times taken as log-normal of this mean and deviation (their spread is skewed: a
        long job is far likelier than a negative one). Past its mean a job is not about to end:
        a log-normal job of mean 60 s and deviation 36 s still has about 40 s left at 60 s."""
        if elapsed <= 0:
            return self
        if self.std <= 0 or self.mean <= 0:
            return Estimate(max(self.mean - elapsed, 0.0), 0.0)
        sigma2 = math.log1p(self.var / (self.mean * self.mean))
        sigma, mu = math.sqrt(sigma2), math.log(self.mean) - sigma2 / 2
        z = (math.log(elapsed) - mu) / sigma
        survival = 0.5 * math.erfc(z / math.sqrt(2))
        if survival < 1e-12:  # far in the tail: nothing better known than "a little more"
            return Estimate(0.0, self.std)
        beyond = self.mean * 0.5 * math.erfc((z - sigma) / math.sqrt(2))  # E[X; X > elapsed]
        return Estimate(max(beyond / survival - elapsed, 0.0), self.std)


def guess() -> Estimate:
    """Nothing measured yet: the operator's guess, as uncertain as it is large."""
    seconds = float(getattr(settings, "GRIDGATE_JOB_SECONDS_GUESS", 60.0))
    return Estimate(seconds, seconds)


def observe(device_id: int, shots: int, seconds: float) -> None:
    """Count a completed job's device time in its band and in the device's all-bands row. One
    short transaction after the job's own (its row locks are these two rows only)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return
    for key in (band(shots), ALL_BANDS):
        with transaction.atomic():
            row, _ = DeviceRuntime.objects.select_for_update().get_or_create(device_id=device_id, band=key)
            row.count += 1
            weight = 1.0 / min(row.count, WINDOW)
            delta = seconds - row.mean
            row.mean += weight * delta
            row.var = (1.0 - weight) * (row.var + weight * delta * delta)
            row.save(update_fields=["count", "mean", "var"])


class Table:
    """Every measured band of some devices, read once (one query), to estimate many jobs."""

    def __init__(self, device_ids):
        self.devices = list(device_ids)
        self.rows = {
            (device_id, key): (count, mean, var)
            for device_id, key, count, mean, var in DeviceRuntime.objects.filter(device_id__in=list(device_ids))
            .order_by()
            .values_list("device_id", "band", "count", "mean", "var")
        }

    def on_device(self, device_id: int, shots: int) -> Estimate:
        for key in (band(shots), ALL_BANDS):
            count, mean, var = self.rows.get((device_id, key), (0, 0.0, 0.0))
            if count >= MIN_JOBS:
                return Estimate(mean, math.sqrt(max(var, 0.0)))
        return guess()

    def on_any(self, device_ids, shots: int) -> Estimate:
        """A job any of ``device_ids`` may take: the mean of their estimates."""
        device_ids = list(device_ids)
        if not device_ids:
            return guess()
        estimates = [self.on_device(device_id, shots) for device_id in device_ids]
        mean = sum(e.mean for e in estimates) / len(estimates)
        var = sum(e.var for e in estimates) / len(estimates)
        return Estimate(mean, math.sqrt(var))
