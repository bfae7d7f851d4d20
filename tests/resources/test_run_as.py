"""R-CASE-8: which Unix account a user's local/Slurm cases run as on a pool (``run_as_for``)."""

import os
import pwd

import pytest
from django.core.exceptions import ValidationError

from apps.backends.base import RunAs
from apps.core.exceptions import Forbidden, Unavailable
from apps.qrmi.models import UnixAccount
from apps.resources.models import ResourcePool
from apps.resources.selectors import run_as_for

pytestmark = pytest.mark.django_db


def unused_uid() -> int:
    uid = 60000
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_linked_user_runs_as_their_own_account(owner, local_pool):
    me = pwd.getpwuid(os.getuid() if os.getuid() != 0 else 65534)
    UnixAccount.objects.create(user=owner, unix_uid=me.pw_uid)
    run_as = run_as_for(owner, local_pool)
    assert (run_as.mode, run_as.uid, run_as.gid, run_as.name) == (RunAs.OWNER, me.pw_uid, me.pw_gid, me.pw_name)
    assert run_as.switches and not run_as.network  # no network unless the pool allows it


def test_unlinked_user_is_refused_with_what_to_ask_an_operator(owner, local_pool):
    with pytest.raises(Forbidden) as refused:
        run_as_for(owner, local_pool)
    assert "operator" in refused.value.detail and refused.value.extra["code"] == "unix_account_required"


def test_user_linked_to_root_never_runs_as_root(owner, local_pool):
    UnixAccount.objects.create(user=owner, unix_uid=0)
    with pytest.raises(Forbidden):
        run_as_for(owner, local_pool)


def test_link_to_a_uid_this_host_does_not_know_is_unavailable_not_a_crash(owner, local_pool):
    UnixAccount.objects.create(user=owner, unix_uid=unused_uid())
    with pytest.raises(Unavailable) as refused:
        run_as_for(owner, local_pool)
    assert "operator" in refused.value.detail


def test_pool_allowing_unlinked_users_runs_them_as_the_sandbox_account(owner, local_pool, settings):
    settings.GRIDGATE_SANDBOX_USER = pwd.getpwuid(65534).pw_name  # nobody: exists everywhere
    local_pool.sandbox_unlinked = True
    local_pool.network = False
    run_as = run_as_for(owner, local_pool)
    assert (run_as.mode, run_as.uid, run_as.network) == (RunAs.SANDBOX, 65534, False)


def test_missing_sandbox_account_is_unavailable_naming_it(owner, local_pool, settings):
    settings.GRIDGATE_SANDBOX_USER = "no-such-gridgate-account"
    local_pool.sandbox_unlinked = True
    with pytest.raises(Unavailable) as refused:
        run_as_for(owner, local_pool)
    assert "no-such-gridgate-account" in refused.value.detail


def test_trusted_pool_runs_as_the_service_without_a_switch(owner, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a developer's own account, not root
    pool = ResourcePool.objects.create(name="laptop", kind="local", public=False, trusted=True)
    run_as = run_as_for(owner, pool)
    assert run_as.mode == RunAs.TRUSTED and not run_as.switches and run_as.uid is None


def test_trusted_pool_of_a_root_service_never_runs_the_command_as_root(owner, monkeypatch, settings):
    """A root service (it must be root to switch to owners' accounts) runs a trusted pool's
    commands as the unprivileged sandbox account, never as root; without that account the launch
    is refused naming it (never nobody as a stand-in: the helper refuses the overflow account)."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    settings.GRIDGATE_SANDBOX_USER = pwd.getpwuid(65534).pw_name
    pool = ResourcePool.objects.create(name="laptop", kind="local", public=False, trusted=True)
    run_as = run_as_for(owner, pool)
    assert run_as.mode == RunAs.SANDBOX and run_as.switches and run_as.uid not in (None, 0)
    settings.GRIDGATE_SANDBOX_USER = "no-such-account-here"
    with pytest.raises(Unavailable, match="no-such-account-here"):
        run_as_for(owner, pool)


def test_trusted_pool_cannot_be_public():
    pool = ResourcePool(name="laptop", kind="local", public=True, trusted=True)
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert "trusted" in refused.value.message_dict


def test_trusted_public_pool_is_refused_by_the_database_too(db):
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        ResourcePool.objects.create(name="laptop", kind="local", public=True, trusted=True)


def test_demo_local_pool_is_a_trusted_private_pool_granted_to_the_demo_users(settings, db, monkeypatch):
    """R-CASE-8: `make run` works for a developer who is not root: the demo's local pool runs
    cases as the service's account, says so, and is not public."""
    from django.core.management import call_command

    from apps.resources.selectors import visible_pools

    settings.DEBUG = True
    call_command("demo")
    pool = ResourcePool.objects.get(name="local")
    assert pool.trusted and not pool.public and not pool.default
    alice = pool.users.get(username="alice")
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # a developer's own account
    assert run_as_for(alice, pool).mode == RunAs.TRUSTED
    assert pool in visible_pools(alice)
