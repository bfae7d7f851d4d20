"""Worker hosts and the cases root they share (issue 17).

Remote backends (Slurm, FirecREST, Qarnot) may be polled, synced and finalized by any worker
host, each reading and writing the case's workspace under ``GRIDGATE_CASES_ROOT``: that directory
must be one shared file system (NFS, GPFS, …) for every worker host. Each host proves what it
sees by writing a marker file there at each heartbeat; ``manage.py doctor`` then reports every
host with a recent heartbeat whose marker it cannot see from where it runs.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

MARKER_DIR = ".worker-hosts"
#: a marker older than its host's heartbeat by more than this was not written through this root
MARKER_SLACK = timedelta(seconds=5)


def marker_path(host: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"
    return Path(settings.GRIDGATE_CASES_ROOT) / MARKER_DIR / safe


def write_marker(host: str, now: datetime) -> None:
    """Write ``host``'s marker (atomically: a reader never sees half a file)."""
    path = marker_path(host)
    path.parent.mkdir(parents=True, exist_ok=True)
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
    """(hosts with a recent heartbeat, those among them whose latest marker this host cannot
    see under its cases root). A marker is "seen" when it is as recent as the heartbeat that
    wrote it (an old marker left from a time the root was shared does not count)."""
    from apps.core.models import WorkerHeartbeat

    now = now or timezone.now()
    recent = now - timedelta(seconds=settings.GRIDGATE_WORKER_STALE_SECONDS)
    beats = list(WorkerHeartbeat.objects.filter(seen_at__gte=recent).order_by("name").values_list("name", "seen_at"))
    unseen = []
    for host, seen_at in beats:
        marked = read_marker(host)
        if marked is None or marked < seen_at - MARKER_SLACK:
            unseen.append(host)
    return [host for host, _ in beats], unseen


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
            f"here under {root}/{MARKER_DIR}/. Remote-backend cases are polled and finalized by any host, so "
            "GRIDGATE_CASES_ROOT must be one shared file system (NFS, GPFS…) mounted at the same path on every "
            "worker host (docs/deployment.md)"
        )
    return True, f"{root} is shared by the {len(hosts)} worker host(s) with a recent heartbeat: {', '.join(hosts)}"
