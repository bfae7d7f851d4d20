"""Shares of ``usage_fair`` pools (R-SCHED-6): fair by decayed device time across users (or
groups), then across each one's sessions by start-time fair queuing.

Level 1, across shares: each user (or group, the pool's ``share_by``) has a weight and a decayed
device time ``U`` (device seconds, halved every ``usage_half_life``). The share with the smallest
``(U + in flight) / weight`` goes next, where *in flight* is the expected device time of its jobs
running and not yet charged (a share does not take every free device while its first job runs).
A job's measured device time is charged to its share when it ends. The pool keeps this level's
virtual time ``V1`` (the key of the last share served, never decreasing, decayed as usage is);
a share that becomes runnable (``queued`` turns on at the first dispatch that sees it with
work) is raised to ``V1`` by a ``catch_up`` term kept apart from the device time it used, so a
newcomer, or a user back from a week away, takes its share from now on and no burst of turns
(R-SCHED-2 at this level), and what a user is shown as used is what its jobs used.

Level 2, across the chosen share's sessions: today's SFQ (``usage_fair``'s charge: device time /
slots at completion) with the share's own virtual time ``FairShare.vtime``.

The catch-up of both levels is applied by the dispatcher, which knows the shares, not by the
submission (V moves only at a dispatch, so the first dispatch after an arrival raises it to the
V the arrival saw). Level 1 marks arrivals explicitly (``queued``): its key may drop without an
arrival, when a job's measured time is below the estimate that stood for it while it ran. At
level 2, charged at completion only, a session runnable all along is never below the share's
virtual time, so a session found below it has arrived since, and is raised then. The pool's own
``PoolQueue.vtime`` does not move in a usage_fair pool, so the submission's raise to it (R-SCHED-2
for ``weighted_fair``, ``statements._caught_up_vruntime``) leaves these sessions as they are.

Decay needs no background work: a row holds ``usage`` as of ``usage_at``; ``decayed`` gives it at
any time, and every write decays then adds, so the order of two concurrent charges does not
matter (``u·d(t2) + c2`` then decayed to ``t1`` plus ``c1`` is the same sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, OuterRef

from apps.scheduling import runtimes
from apps.scheduling.models import UNFINISHED, Device, FairShare, Job, JobStatus, PoolQueue
from apps.sessions.models import Session, SessionStatus

Key = tuple[str, int]  # ("user", id) or ("group", id)


def decayed(value: float, since: float, now: float, half_life: float) -> float:
    if not value:
        return 0.0
    return value * 0.5 ** (max(now - since, 0.0) / half_life)


# -- whose share ---------------------------------------------------------------------------------
def keys_of(pool, user_ids) -> dict[int, Key]:
    """The share each of ``user_ids`` counts under on ``pool``: their own, or with ``share_by``
    ``group`` the first (by name, then id) of the pool's granted groups they belong to (their own
    when none: a public pool, or a user granted directly)."""
    user_ids = set(user_ids)
    keys: dict[int, Key] = {user_id: ("user", user_id) for user_id in user_ids}
    if pool.share_by != "group" or not user_ids:
        return keys
    members = get_user_model().groups.through.objects
    granted = pool.groups.through.objects.filter(resourcepool_id=pool.pk).values("group_id")
    rows = (
        members.filter(user_id__in=user_ids, group_id__in=granted)
        .order_by("group__name", "group_id")
        .values_list("user_id", "group_id")
    )
    chosen = set()
    for user_id, group_id in rows:
        if user_id not in chosen:
            keys[user_id] = ("group", group_id)
            chosen.add(user_id)
    return keys


def key_of(share: FairShare) -> Key:
    return ("group", share.group_id) if share.group_id else ("user", share.user_id)


def _filter(key: Key) -> dict:
    return {"user_id": key[1]} if key[0] == "user" else {"group_id": key[1]}


def read(pool, keys, now: float) -> dict[Key, FairShare]:
    """The pool's share rows for ``keys``, an unsaved default (weight 1, nothing used, not
    queued) where none exists yet: what the read paths (positions, overview) use, creating nothing."""
    found = _read(pool, set(keys))
    for key in keys:
        found.setdefault(key, _default(pool, key, now))
    return found


def _default(pool, key: Key, now: float) -> FairShare:
    return FairShare(pool=pool, weight=1.0, usage=0.0, usage_at=now, **_filter(key))


def rows(pool, keys) -> dict[Key, FairShare]:
    """The pool's share rows for ``keys``, created (weight 1, no usage) where missing."""
    keys = set(keys)
    found = _read(pool, keys)
    missing = keys - set(found)
    if missing:
        new = [FairShare(pool_id=pool.pk, **_filter(key)) for key in missing]
        FairShare.objects.bulk_create(new, ignore_conflicts=True)
        found = _read(pool, keys)
    return found


def _read(pool, keys) -> dict[Key, FairShare]:
    users = [k[1] for k in keys if k[0] == "user"]
    groups = [k[1] for k in keys if k[0] == "group"]
    out = {}
    for share in FairShare.objects.filter(pool_id=pool.pk, user_id__in=users):
        out[("user", share.user_id)] = share
    if groups:
        for share in FairShare.objects.filter(pool_id=pool.pk, group_id__in=groups):
            out[("group", share.group_id)] = share
    return out


# -- charging ------------------------------------------------------------------------------------
def charge(pool, user_id: int, seconds: float, now: float) -> None:
    """A job of ``user_id`` used ``seconds`` of device time, ending at ``now`` (Unix time)."""
    key = keys_of(pool, [user_id])[user_id]
    share_id = rows(pool, [key])[key].pk
    with transaction.atomic():
        share = FairShare.objects.select_for_update().get(pk=share_id)
        _decay_to(share, now, pool.usage_half_life)
        share.usage += seconds
        share.save(update_fields=["usage", "catch_up", "usage_at"])


def _decay_to(share: FairShare, now: float, half_life: float) -> None:
    share.usage = decayed(share.usage, share.usage_at, now, half_life)
    share.catch_up = decayed(share.catch_up, share.usage_at, now, half_life)
    share.usage_at = now


def in_flight(pool, keys: dict[int, Key]) -> dict[Key, float]:
    """Expected device time of each share's running jobs not charged yet."""
    running = list(
        Job.objects.filter(pool_id=pool.pk, status=JobStatus.RUNNING, charged=False).values_list(
            "user_id", "device_id", "shots"
        )
    )
    if not running:
        return {}
    more = keys_of(pool, {user_id for user_id, _, _ in running} - set(keys))
    table = runtimes.Table({device_id for _, device_id, _ in running})
    out: dict[Key, float] = {}
    for user_id, device_id, shots in running:
        key = keys.get(user_id) or more[user_id]
        out[key] = out.get(key, 0.0) + table.on_device(device_id, shots).mean
    return out


def level_one(pool, shares: dict[Key, FairShare], flying: dict[Key, float], v1: float, now: float) -> dict:
    """Each runnable share's key, ``(usage + catch-up + in flight) / weight`` decayed to ``now``;
    a share that was not queued (it becomes runnable now) starts at ``v1`` at least. The one
    definition for the dispatcher, the queue's positions and the shares' overview."""
    half_life = pool.usage_half_life
    keys = {}
    for key, share in shares.items():
        used = decayed(share.usage, share.usage_at, now, half_life)
        extra = decayed(share.catch_up, share.usage_at, now, half_life)
        value = (used + extra + flying.get(key, 0.0)) / share.weight
        keys[key] = value if share.queued else max(value, v1)
    return keys


def first_share(ranked: dict[Key, float]) -> tuple[float, Key]:
    """Level 1's pick among ``ranked`` (:func:`level_one`'s keys): the smallest key, and on a
    tie groups before users, then the smaller id."""
    return min((value, key) for key, value in ranked.items())


def first_session(rows, vtime: float):
    """Level 2's pick among one share's runnable sessions (rows of id, user id, vruntime, slots,
    created at): the smallest vruntime, each counted at least at the share's virtual time
    ``vtime`` (a session that arrives is not behind the others); ties: the older, then the id."""
    return min(rows, key=lambda row: (max(row[2], vtime), row[4], str(row[0])))


# -- choosing the next job -----------------------------------------------------------------------
@dataclass
class Choice:
    """What the dispatcher serves (``session_id``) and what it writes once the job is claimed."""

    session_id: object
    share: FairShare
    key: float  # the share's key when chosen: the new V1 candidate
    v1: float
    arrived: list  # (share, in flight) runnable and not queued: raised to V1, queued
    runnable: set  # share ids with work now


def choose(pool, queue: PoolQueue, runnable, now: float) -> Choice | None:
    """The session to serve among ``runnable`` (rows of id, user id, vruntime, slots, created at)."""
    if not runnable:
        return None
    keys = keys_of(pool, {row[1] for row in runnable})
    shares = rows(pool, set(keys.values()))
    flying = in_flight(pool, keys)
    v1 = decayed(queue.share_vtime, queue.share_vtime_at, now, pool.usage_half_life)
    ranked = level_one(pool, shares, flying, v1, now)
    value, key = first_share(ranked)
    share = shares[key]
    mine = [row for row in runnable if keys[row[1]] == key]
    session_id = first_session(mine, share.vtime)[0]
    behind = [row[0] for row in mine if row[2] < share.vtime]
    if behind:
        Session.objects.filter(pk__in=behind, vruntime__lt=share.vtime).update(vruntime=share.vtime)
    arrived = [(s, flying.get(k, 0.0)) for k, s in shares.items() if not s.queued]
    return Choice(session_id, share, value, v1, arrived, {s.pk for s in shares.values()})


def served(pool, queue: PoolQueue, choice: Choice, vruntime: float, now: float) -> None:
    """After the claim: shares that became runnable are raised to V1 and marked queued (under
    their row lock, recomputed: a charge may have landed meanwhile), shares left with no work
    are unmarked, V1 and the share's V move to what was served."""
    if choice.arrived:
        flights = {share.pk: flight for share, flight in choice.arrived}
        with transaction.atomic():
            arrived = list(FairShare.objects.select_for_update().filter(pk__in=flights).order_by("pk"))
            for row in arrived:
                _decay_to(row, now, pool.usage_half_life)
                row.catch_up = max(row.catch_up, choice.v1 * row.weight - flights[row.pk] - row.usage)
                row.queued = True
            FairShare.objects.bulk_update(arrived, ["usage", "catch_up", "usage_at", "queued"])
    FairShare.objects.filter(pool_id=pool.pk, queued=True).exclude(pk__in=choice.runnable).update(queued=False)
    FairShare.objects.filter(pk=choice.share.pk, vtime__lt=vruntime).update(vtime=vruntime)
    if choice.key > choice.v1:
        queue.share_vtime, queue.share_vtime_at = choice.key, now
        PoolQueue.objects.filter(pk=queue.pk).update(share_vtime=choice.key, share_vtime_at=now)


def runnable_sessions(pool_id: int, eligible):
    """Active sessions of the pool with a job ``eligible`` may take, as rows for :func:`choose`."""
    return list(
        Session.objects.filter(pool_id=pool_id, status=SessionStatus.ACTIVE)
        .filter(Exists(eligible.filter(session_id=OuterRef("pk"))))
        .values_list("id", "user_id", "vruntime", "slots", "created_at")
    )


# -- on demand -----------------------------------------------------------------------------------
def recompute(pool, now: float) -> int:
    """Rebuild every share's decayed usage of ``pool`` from its job history (the jobs that ran:
    their measured device time, decayed from when they ended). Returns the jobs counted."""
    half_life = pool.usage_half_life
    # Older jobs weigh less than 2^-64; never before the epoch (no job ended then), which a
    # half-life of decades would put before year 1 (an error).
    horizon = datetime.fromtimestamp(max(now - 64 * half_life, 0.0), tz=UTC)
    jobs = (
        Job.objects.filter(pool_id=pool.pk, runtime_seconds__gt=0, finished_at__gte=horizon)
        .exclude(status__in=UNFINISHED)
        .order_by()
        .values_list("user_id", "runtime_seconds", "finished_at")
    )
    totals: dict[int, float] = {}
    counted = 0
    for user_id, seconds, finished_at in jobs.iterator(chunk_size=5000):
        totals[user_id] = totals.get(user_id, 0.0) + decayed(seconds, finished_at.timestamp(), now, half_life)
        counted += 1
    keys = keys_of(pool, totals)
    usage: dict[Key, float] = {}
    for user_id, value in totals.items():
        usage[keys[user_id]] = usage.get(keys[user_id], 0.0) + value
    shares = rows(pool, usage)
    with transaction.atomic():
        FairShare.objects.filter(pool_id=pool.pk).update(usage=0.0, catch_up=0.0, usage_at=now)
        for key, value in usage.items():
            FairShare.objects.filter(pk=shares[key].pk).update(usage=value, usage_at=now)
    return counted


@dataclass(frozen=True)
class ShareView:
    """A share as its owner (or staff) sees it."""

    share: FairShare
    usage: float  # decayed device seconds now
    entitled: float  # weight / the weights of the shares with work in the pool (0–1), 0 when idle
    used: float  # its part of the pool's decayed usage (0–1)
    position: int | None  # 1 = served next among the shares with work pending; None: nothing pending
    waiting: int  # shares with work pending
    pending_jobs: int
    running_jobs: int


def overview(pool, now: float, *, include=()) -> list[ShareView]:
    """Every share of ``pool`` with its figures, ordered by position (then usage), and the shares
    ``include`` names even if they never ran (weight 1, nothing used): a constant number of
    queries whatever the shares, users and jobs (the unfinished jobs are counted per user)."""
    counts: dict[int, dict] = {}
    for user_id, status, n in _unfinished_counts(pool):
        counts.setdefault(user_id, {JobStatus.PENDING: 0, JobStatus.RUNNING: 0})[status] = n
    keys = keys_of(pool, counts)
    shares = _read_all(pool)
    for key in {*keys.values(), *include} - set(shares):
        shares[key] = _default(pool, key, now)
    per_share: dict[Key, dict] = {}
    for user_id, by_status in counts.items():
        slot = per_share.setdefault(keys[user_id], {JobStatus.PENDING: 0, JobStatus.RUNNING: 0})
        for status, n in by_status.items():
            slot[status] += n
    flying = in_flight(pool, keys)
    queue = PoolQueue.objects.filter(pool_id=pool.pk).first()
    v1 = decayed(queue.share_vtime, queue.share_vtime_at, now, pool.usage_half_life) if queue else 0.0
    usage = {k: decayed(s.usage, s.usage_at, now, pool.usage_half_life) for k, s in shares.items()}
    total_usage = sum(usage.values())
    active = {k for k, c in per_share.items() if c[JobStatus.PENDING] or c[JobStatus.RUNNING]}
    total_weight = sum(shares[k].weight for k in active)
    pending = {k: shares[k] for k, c in per_share.items() if c[JobStatus.PENDING]}
    waiting = sorted((value, k) for k, value in level_one(pool, pending, flying, v1, now).items())
    position = {k: i for i, (_, k) in enumerate(waiting, start=1)}
    views = [
        ShareView(
            share=share,
            usage=usage[k],
            entitled=share.weight / total_weight if k in active and total_weight else 0.0,
            used=usage[k] / total_usage if total_usage else 0.0,
            position=position.get(k),
            waiting=len(position),
            pending_jobs=per_share.get(k, {}).get(JobStatus.PENDING, 0),
            running_jobs=per_share.get(k, {}).get(JobStatus.RUNNING, 0),
        )
        for k, share in shares.items()
    ]
    views.sort(key=lambda v: (v.position or math.inf, -v.usage, v.share.pk or 0))
    return views


def _read_all(pool) -> dict[Key, FairShare]:
    out = {}
    for share in FairShare.objects.filter(pool_id=pool.pk).select_related("user", "group"):
        out[key_of(share)] = share
    return out


def _unfinished_counts(pool):
    from django.db.models import Count

    return (
        Job.objects.filter(pool_id=pool.pk, status__in=UNFINISHED)
        .order_by()
        .values_list("user_id", "status")
        .annotate(n=Count("pk"))
    )


def devices_of(pool_id: int) -> list[int]:
    return list(Device.objects.filter(pool_id=pool_id).values_list("pk", flat=True))
