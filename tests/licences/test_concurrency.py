"""The licence sync under concurrency (PostgreSQL, threads): a change that arrives while a sync
of its pool is finishing is never left pending with no sync to run it."""

import threading

import pytest
from django.db import connection

from apps.licences import passes
from apps.licences.models import LicenceState
from apps.sessions import services as sessions

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_session_admitted_while_a_sync_finishes_is_synced(licensed_pool, owner, fake_slurm, settings, monkeypatch):
    """A sync has found nothing pending and is about to release its lease when a REST session is
    admitted: the admission marks the pool pending and sends a sync, which finds the lease still
    held and leaves the change to the running one, which has stopped looking. Slurm kept handing
    out 2 licences for 1 free slot until the next reconcile pass (a batch job's acquire: 409)."""
    settings.GRIDGATE_TASKS_EAGER = True  # the sync the admission sends runs at once, in its thread
    licence = licensed_pool.slurm_licence
    finishing, admitted = threading.Event(), threading.Event()
    original = passes.release_lease
    first = []

    def release_lease(name, owner_token):
        if not first:
            first.append(name)
            finishing.set()  # the running sync checked that nothing is pending
            admitted.wait(30)
        return original(name, owner_token)

    monkeypatch.setattr(passes, "release_lease", release_lease)
    outcomes = {}

    def sync():
        try:
            outcomes["sync"] = passes.sync_pool(licensed_pool.pk)
        finally:
            connection.close()

    def admit():
        try:
            assert finishing.wait(30)
            sessions.admit(user=owner, resource_class=licensed_pool.classes.get())
            outcomes["admit"] = "admitted"
        finally:
            admitted.set()
            connection.close()

    threads = [threading.Thread(target=sync), threading.Thread(target=admit)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes["admit"] == "admitted"
    assert passes.wanted(licensed_pool)[0] == 1
    assert fake_slurm.counts[licence] == 1  # Slurm hands out the one slot left, not two
    assert LicenceState.objects.get(pool=licensed_pool).pending_since is None
