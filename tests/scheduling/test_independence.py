"""R-SESS-7: admission, release and job submission in the same pool never fail each other. A
submission is refused only for a change that matters to it (its session ended, the pool's or a
device's configuration changed), never because another client's session came or went; and a
configuration change racing submissions is retried inside them, never answered 503.

PostgreSQL with real threads, each with its own connection, in autocommit as in production (the
submission's version check reads the rows' ``xmin``)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from apps.core.exceptions import Unavailable
from apps.resources.models import PoolUsage
from apps.scheduling import known, services
from apps.scheduling.drivers import DriverError
from apps.scheduling.models import Device, Job
from apps.sessions import services as sessions
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CYCLERS, SUBMITTERS, ROUNDS = 8, 8, 30
SLOTS = 12  # fewer than the cyclers could hold together with the submitters: some admissions are refused


@pytest.fixture(autouse=True)
def no_inline_dispatch(settings):
    settings.GRIDGATE_TASKS_EAGER = False
    known.clear()


@pytest.fixture
def crowded(qpu_pool):
    """The pool with a small capacity and one emulator device, and one user per client."""
    qpu_pool.slots_total = SLOTS
    qpu_pool.save()
    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 4})
    users = [get_user_model().objects.create_user(f"client-{i}") for i in range(CYCLERS + SUBMITTERS)]
    return qpu_pool, device, users


def run_together(cycle, submit):
    """``cycle(i)`` on the cyclers' threads and ``submit(i)`` on the submitters', all at once, while
    a watcher reads the pool's usage; each thread closes its connection. Returns what the watcher
    saw."""
    start = threading.Barrier(CYCLERS + SUBMITTERS + 1)
    done = threading.Event()
    seen = []

    def on_thread(work, i):
        try:
            start.wait(timeout=60)
            return work(i)
        finally:
            connection.close()

    def watch():
        try:
            start.wait(timeout=60)
            while not done.is_set():
                seen.append(PoolUsage.objects.values_list("slots_used", flat=True).get(pool_id=pool_id))
        finally:
            connection.close()

    pool_id = Device.objects.values_list("pool_id", flat=True).get()
    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(max_workers=CYCLERS + SUBMITTERS) as executor:
        cyclers = [executor.submit(on_thread, cycle, i) for i in range(CYCLERS)]
        submitters = [executor.submit(on_thread, submit, i) for i in range(SUBMITTERS)]
        results = [future.result() for future in cyclers], [future.result() for future in submitters]
    done.set()
    watcher.join()
    return results, seen


def test_r_sess_7_sessions_coming_and_going_never_fail_a_submission_beside_them(crowded, open_session):
    pool, _, users = crowded
    submitters = users[CYCLERS:]
    held = [open_session(pool, user) for user in submitters]  # one slot each, held throughout
    sequence = analog_sequence(2)

    def cycle(i):
        admitted = refused = 0
        for _ in range(ROUNDS):
            try:
                session = sessions.admit(user=users[i], resource_class=pool.classes.get(), slots=1 + i % 3).session
            except sessions.CapacityExceeded:
                refused += 1
                continue
            admitted += 1
            sessions.release(user=users[i], session_id=session.pk)
        return admitted, refused

    def submit(i):
        failed = []
        for _ in range(ROUNDS):
            try:
                services.submit_job(user=submitters[i], session_id=held[i].pk, payload={"sequence": sequence}, shots=1)
            except Unavailable as exc:
                failed.append(str(exc))
        return failed

    (cycled, failures), seen = run_together(cycle, submit)

    assert [failure for failed in failures for failure in failed] == []
    assert Job.objects.filter(pool=pool).count() == SUBMITTERS * ROUNDS
    assert sum(admitted for admitted, _ in cycled) > 0  # sessions did come and go meanwhile
    assert seen and max(seen) <= SLOTS  # never oversubscribed, at any instant the watcher saw
    assert PoolUsage.objects.get(pool=pool).slots_used == SUBMITTERS  # what is left: the held sessions


def test_r_sess_7_a_device_reconfigured_mid_run_is_honoured_by_every_submission_after_the_change_commits(
    crowded, open_session
):
    """While sessions come and go and submissions flow (remembered sessions included), an
    administrator lowers the device's atom limit below the sequence's: every submission that
    starts after the change committed is checked against it (400), none is stored after it, and
    none is answered 503."""
    pool, device, users = crowded
    submitters = users[CYCLERS:]
    held = [open_session(pool, user) for user in submitters]
    sequence = analog_sequence(2)
    changed_at = []
    submitted, lock = [0], threading.Lock()

    def change_once_a_third_is_in():
        """The administrator's change, on the thread of the submission that brought the count to
        a third of them: mid-run, while the others go on."""
        with lock:
            submitted[0] += 1
            if submitted[0] != SUBMITTERS * ROUNDS // 3:
                return
        Device.objects.filter(pk=device.pk).update(config={"max_atoms": 1}, paused_reason="calibration")
        changed_at.append(timezone.now())  # after the change committed (autocommit)

    def cycle(i):
        for _ in range(ROUNDS):
            try:
                session = sessions.admit(user=users[i], resource_class=pool.classes.get(), slots=1).session
            except sessions.CapacityExceeded:
                continue
            sessions.release(user=users[i], session_id=session.pk)

    def submit(i):
        outcomes = []
        for _ in range(ROUNDS):
            began = timezone.now()
            try:
                services.submit_job(user=submitters[i], session_id=held[i].pk, payload={"sequence": sequence}, shots=1)
                outcomes.append((began, "stored"))
                change_once_a_third_is_in()
            except DriverError:
                outcomes.append((began, "refused"))
            except Unavailable:
                outcomes.append((began, "503"))
        return outcomes

    (_, outcomes), _ = run_together(cycle, submit)
    (changed,) = changed_at
    flat = [outcome for per_client in outcomes for outcome in per_client]
    assert all(kind != "503" for _, kind in flat)
    assert all(kind == "refused" for began, kind in flat if began > changed)
    assert any(kind == "stored" for _, kind in flat)  # the change came mid-run
    assert not Job.objects.filter(pool=pool, created_at__gt=changed).exists()


def racing_every_read(monkeypatch, change) -> list[str]:
    """After each read of the session's pool and devices (``statements.target``), an
    administrator's ``change`` runs in its own transaction and thread before the submission's
    statement. The list says, per attempt, whether the change committed or was refused."""
    from django.db import DatabaseError, transaction

    from apps.scheduling import statements

    read, changes = statements.target, []

    def administrator():
        try:
            with transaction.atomic():
                change(len(changes))
            changes.append("committed")
        except DatabaseError:
            changes.append("refused: the submission holds the configuration")
        finally:
            connection.close()

    def read_then_change(session_id, pool_name):
        found = read(session_id, pool_name)
        racer = threading.Thread(target=administrator)
        racer.start()
        racer.join()
        return found

    monkeypatch.setattr(statements, "target", read_then_change)
    return changes


def assert_every_attempt_but_the_last_was_raced(changes) -> None:
    assert changes == ["committed"] * (services.SUBMISSION_ATTEMPTS - 1) + [
        "refused: the submission holds the configuration"
    ]


def test_r_sess_7_a_configuration_change_racing_every_attempt_costs_retries_never_a_503(
    qpu_pool, open_session, owner, monkeypatch
):
    """The worst race: after each read of the session's pool and devices, an administrator's
    change commits before the submission's statement. The attempts before the last retry; the
    last holds the configuration until it commits, so the change cannot get in (it is refused
    at once here, NOWAIT) and the job is stored against the configuration it was checked with."""
    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 4})
    session = open_session(qpu_pool, owner)

    def reconfigure(attempt):
        # The lock the UPDATE itself takes (FOR NO KEY UPDATE), asked NOWAIT: refused at once only
        # while the submission shares the row (FOR SHARE; a key-share lock would let it in).
        Device.objects.select_for_update(nowait=True, no_key=True).get(pk=device.pk)
        Device.objects.filter(pk=device.pk).update(max_concurrent_jobs=attempt + 2)

    changes = racing_every_read(monkeypatch, reconfigure)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence(2)}, shots=1)
    assert Job.objects.filter(pk=job.pk).exists()
    assert_every_attempt_but_the_last_was_raced(changes)


def test_r_sess_7_a_device_added_racing_every_attempt_costs_retries_never_a_503(
    qpu_pool, open_session, owner, monkeypatch
):
    """As above, with the change an administrator's new device: it adds a row, which no lock on
    the existing devices holds back; the last attempt's hold on the pool row does (a new device
    takes a key-share lock on its pool), and the job is stored against the devices it was
    checked with."""
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 4})
    session = open_session(qpu_pool, owner)

    def add_device(attempt):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '200ms'")
        Device.objects.create(pool=qpu_pool, name=f"emu-{attempt}", driver="fake")

    changes = racing_every_read(monkeypatch, add_device)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence(2)}, shots=1)
    assert Job.objects.filter(pk=job.pk).exists()
    assert_every_attempt_but_the_last_was_raced(changes)
