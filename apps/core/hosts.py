"""Worker hosts and the cases root they share.

Every web and worker host reads and writes case workspaces under ``GRIDGATE_CASES_ROOT``, whatever
the backend: remote backends' cases are polled, synced and finalized by any worker host; a local
case's inputs are written and its logs and results served by the web processes, and its launch
is submitted by any worker host until one pins it. With more than one host that directory must
be one shared file system (NFS, GPFS, …). Each worker host proves what it sees by writing a
marker file there at each heartbeat; ``manage.py doctor`` then reports every host with a recent
heartbeat whose marker it cannot see from where it runs.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from apps.core.cases_root import CasesRootError, ensure_cases_root

log = logging.getLogger(__name__)

MARKER_DIR = ".worker-hosts"


def marker_path(host: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"
    return Path(settings.GRIDGATE_CASES_ROOT) / MARKER_DIR / safe


def write_marker(host: str, now: datetime) -> None:
    """Write ``host``'s marker (atomically: a reader never sees half a file)."""
    path = marker_path(host)
    try:
        # The heartbeat is often the first to need the root (a worker starts before any case
        # exists): it must not be the one that leaves it 0755.
        ensure_cases_root()
    except CasesRootError as exc:
        # Not a reason to lose the marker (doctor would then also call the root unshared);
        # doctor's "cases root" check reports it with the fix.
        log.warning("%s", exc)
    path.parent.mkdir(exist_ok=True)
    partial = path.with_name(f".{path.name}.part")
    partial.write_text(json.dumps({"host": host, "at": now.isoformat()}))
    partial.replace(path)


def read_marker(host: str) -> datetime | None:
    try:
        data = json.loads(marker_path(host).read_text())
        if data.get("host") != host:
            return None
        return datetime.fromisoformat(data["at"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def unseen_hosts(now: datetime | None = None) -> tuple[list[str], list[str]]:
    """(hosts with a recent heartbeat, those among them whose marker this host cannot see under
    its cases root). A marker is "seen" when it is itself recent: written within
    ``GRIDGATE_WORKER_STALE_SECONDS``, the window that makes a heartbeat recent (an old marker
    left from a time the root was shared does not count). Not compared with the heartbeat's own
    time: NFS serves a name from its attribute and directory caches (30–60 s by default), so the
    marker seen here may be an earlier beat's; a few seconds of slack would call such a root
    unshared."""
    from apps.core.models import WorkerHeartbeat

    now = now or timezone.now()
    recent = now - timedelta(seconds=settings.GRIDGATE_WORKER_STALE_SECONDS)
    hosts = list(WorkerHeartbeat.objects.filter(seen_at__gte=recent).order_by("name").values_list("name", flat=True))
    unseen = []
    for host in hosts:
        marked = read_marker(host)
        if marked is None or marked < recent:
            unseen.append(host)
    return hosts, unseen


def shared_root_check(now: datetime | None = None) -> tuple[bool, str]:
    """``manage.py doctor``'s check that every live worker host shares this cases root."""
    root = settings.GRIDGATE_CASES_ROOT
    hosts, unseen = unseen_hosts(now)
    if not hosts:
        stale = settings.GRIDGATE_WORKER_STALE_SECONDS
        return True, f"no worker host heartbeat in the last {stale} s: nothing to compare"
    if unseen:
        return False, (
            f"{root} is not shared with worker host(s) {', '.join(unseen)}: their heartbeat markers are not visible "
            f"here under {root}/{MARKER_DIR}/. Case workspaces are written and read by every web and worker host "
            "(inputs, logs, results; remote cases are polled by any host), so GRIDGATE_CASES_ROOT must be one shared "
            "file system (NFS, GPFS…) mounted at the same path on every host (docs/deployment.md)"
        )
    return True, f"{root} is shared by the {len(hosts)} worker host(s) with a recent heartbeat: {', '.join(hosts)}"
