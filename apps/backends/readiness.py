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

from apps.backends import sealing
from apps.backends.registry import NoBackend, backend_name_for_kind
from apps.core import credentials
from apps.resources.remote import USER, credential_mode

ASK = "Ask an administrator to finish setting it up."
NOT_YET = "Cases cannot run on this pool yet:"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    message: str = ""
    runs_cases: bool = True  # False: the pool's kind has no case backend at all


#: commands a backend runs on this host (missing: the backend cannot work here)
COMMANDS = {"slurm": ("sbatch", "squeue", "scancel")}


def case_readiness(pool) -> Readiness:
    """Whether cases can be launched on ``pool`` from this host, and if not, why in plain words."""
    try:
        name = backend_name_for_kind(pool.kind)
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
        missing_credentials = [
            key
            for key, env_name in remote.items()
            if key.endswith("_env")
            and env_name
            and (credentials.name_problem(env_name) or not os.environ.get(env_name))
        ]
        if missing_credentials:
            return Readiness(False, f"{NOT_YET} its connection to the provider has no credentials. {ASK}")
    if name in ("slurm", "firecrest", "runai") and not remote.get("working_root"):
        return Readiness(False, f"{NOT_YET} it has no working directory on the cluster. {ASK}")
    if name == "runai" and not remote.get("image"):
        return Readiness(False, f"{NOT_YET} it names no container image to run cases in. {ASK}")
    for command in COMMANDS.get(name, ()):
        if shutil.which(command) is None:
            return Readiness(False, f"{NOT_YET} the cluster's tools are not installed here. {ASK}")
    return Readiness(True)
