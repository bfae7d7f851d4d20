"""Is a pool's case backend set up here? A cheap answer for the user pages.

``doctor`` (R-BACK-5) asks the provider and is for operators; the pages must not call a provider
on every load. This module answers from what this host knows without the network: the pool's kind
has a backend, the credentials its ``remote`` names are present in the environment (never their
values), the commands a backend runs are installed. The message is in user language: it names no
environment variable and says whom to ask.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import cache

from apps.backends.registry import NoBackend, backend_class, backend_name_for_kind
from apps.core import credentials
from apps.credentials import sealing
from apps.resources.remote import USER, credential_mode

ASK = "Ask an administrator to finish setting it up."
NOT_YET = "Cases cannot run on this pool yet:"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    message: str = ""
    runs_cases: bool = True  # False: the pool's kind has no case backend at all


def case_readiness(pool) -> Readiness:
    """Whether cases can be launched on ``pool`` from this host, and if not, why in plain words."""
    try:
        backend = backend_class(backend_name_for_kind(pool.kind))
    except NoBackend:
        return Readiness(False, "This pool does not run cases.", runs_cases=False)
    remote = pool.remote_config()
    if credential_mode(pool.kind, pool.remote) == USER:
        # Each user's own credential runs their cases (docs/backends.md, "Per-user credentials"):
        # whether this user is connected is the launch's to say, with the page to connect at.
        if not sealing.available():
            return Readiness(False, f"{NOT_YET} it needs each user's own credentials, which cannot be kept yet. {ASK}")
    else:
        # A credential the service will not read (a name without the GRIDGATE_CRED_ prefix, from a
        # pool saved before that rule) is as missing as an unset one.
        if any(
            key.endswith("_env") and env_name and (credentials.name_problem(env_name) or not os.environ.get(env_name))
            for key, env_name in remote.items()
        ):
            return Readiness(False, f"{NOT_YET} its connection to the provider has no credentials. {ASK}")
    for key, missing in backend.needs:
        if not remote.get(key):
            return Readiness(False, f"{NOT_YET} {missing}. {ASK}")
    if any(shutil.which(command) is None for command in backend.commands):
        return Readiness(False, f"{NOT_YET} the cluster's tools are not installed here. {ASK}")
    return Readiness(True)


@dataclass(frozen=True)
class Usability:
    """Whether ``user`` may put work on a pool now, and if not why, in user language.

    ``runs``: what the pool takes, ``"jobs"`` (it has devices: open a session, submit Pulser
    sequences), ``"cases"`` (its kind has a case backend) or ``""`` (nothing yet).
    """

    usable: bool
    runs: str
    reason: str = ""


def user_readiness(user, pools) -> dict[int, Usability]:
    """Per pool of ``pools``, whether ``user``'s work would be accepted there: the host's set-up
    (:func:`case_readiness`), the Unix account a case runs as (R-CASE-8,
    ``apps.resources.selectors.run_as_for``) and the user's own provider credential
    (``apps.credentials.services.connection_refusal``): the rules a launch applies, asked without
    a provider call and in a constant number of queries (devices, the user's link, the user's
    connections) whatever the number of pools.

    A pool with devices takes jobs; sessions are admitted on any pool the user sees (an operator's
    "not accessible" is a hint to schedulers, R-SESS-5), so such a pool is usable.
    """
    from apps.core.exceptions import ServiceError
    from apps.credentials import services as credential_services
    from apps.credentials.models import RemoteConnection
    from apps.qrmi.selectors import unix_uid_for
    from apps.resources.selectors import run_as_for
    from apps.scheduling.models import Device

    pools = list(pools)
    ids = [pool.pk for pool in pools]
    with_devices = set(Device.objects.filter(pool_id__in=ids).order_by().values_list("pool_id", flat=True).distinct())

    # Read once, and only if a pool needs them.
    @cache
    def linked_uid():
        return unix_uid_for(user) if user is not None else None

    @cache
    def connections():
        rows = RemoteConnection.objects.filter(user=user, pool_id__in=ids).only("pool_id", "state", "failure")
        return {row.pool_id: row for row in rows}

    out = {}
    for pool in pools:
        if pool.pk in with_devices:
            out[pool.pk] = Usability(True, "jobs")
            continue
        host = case_readiness(pool)
        if not host.ready:
            out[pool.pk] = Usability(False, "cases" if host.runs_cases else "", host.message)
            continue
        try:
            if backend_class(backend_name_for_kind(pool.kind)).runs_as_user:
                run_as_for(user, pool, uid=linked_uid())
            if credential_services.needs_user_credentials(pool):
                refusal = credential_services.connection_refusal(pool, connections().get(pool.pk))
                if refusal is not None:
                    raise refusal
        except ServiceError as exc:
            out[pool.pk] = Usability(False, "cases", exc.detail)
            continue
        out[pool.pk] = Usability(True, "cases")
    return out
