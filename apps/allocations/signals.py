"""The allocations' signal, for whoever wants to tell a project it is running out (R-NOTE-1).

``allocation_threshold`` is sent AFTER the charge's transaction commits (``on_commit``), once per
charge that takes an allocation's spending of the current period across 80 % or 100 % of a
limited grant (a charge that crosses both sends two: 80, then 100). Keyword arguments:

- ``allocation_id`` (int), ``threshold`` (80 or 100), ``resource`` (``"device_seconds"`` or
  ``"core_hours"``), ``used`` and ``granted`` (floats, in that resource's unit, after the charge),
  ``period_start`` (datetime, the period the spending is of).

Receivers run in the worker that recorded the charge: keep them quick (enqueue a task) and
idempotent by (allocation_id, period_start, resource, threshold) if they must never repeat.
"""

from django.dispatch import Signal

allocation_threshold = Signal()
THRESHOLDS = (80, 100)
