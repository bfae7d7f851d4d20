"""How the service asks for what only root may do: one call of the privileged helper
(``apps/backends/privileged.py``) per operation, a JSON request in, a JSON answer out.

``GRIDGATE_PRIVILEGED_COMMAND`` is the helper's command line: on a site whose web and worker run
as the service's own account, the one sudo rule that runs a root-owned copy of the helper
(docs/deployment.md); unset, this checkout's file run by this interpreter, which is right when
the service runs as root itself (or, unprivileged, for trusted pools that run as the service).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from apps.backends import privileged
from apps.backends.base import BackendError, Check, ResultsTooLarge

HELPER = Path(privileged.__file__).resolve()


def config(*, working_roots=()) -> dict:
    """The helper's configuration when it runs without sudo (with sudo it reads its own,
    /etc/gridgate/privileged.json, and ignores this)."""
    return {
        "cases_root": str(settings.GRIDGATE_CASES_ROOT),
        "service_uid": os.geteuid(),
        "service_gid": os.getegid(),
        "min_uid": settings.GRIDGATE_CASE_MIN_UID,
        "sandbox_accounts": [settings.GRIDGATE_SANDBOX_USER],
        "working_roots": [str(root) for root in working_roots],
        "cgroup": settings.GRIDGATE_CASE_CGROUP,
        "nproc": settings.GRIDGATE_CASE_NPROC,
        "slurm_conf": os.environ.get("SLURM_CONF") or None,
    }


def call(verb: str, request: dict, *, timeout: float, working_roots=()) -> dict:
    """The helper's answer to ``verb``; raises BackendError with its refusal (ResultsTooLarge
    when the results are over the case's storage)."""
    body = {"version": privileged.PROTOCOL, "config": config(working_roots=working_roots), **request}
    configured = settings.GRIDGATE_PRIVILEGED_COMMAND
    helper = shlex.split(configured) if configured else [sys.executable, "-I", "-S", str(HELPER)]
    try:
        proc = subprocess.run(
            [*helper, verb],
            input=json.dumps(body),
            capture_output=True,
            text=True,
            timeout=timeout,
            # Nothing of the service's environment: SUDO_UID above all, which would make a helper
            # run directly by a root service read the sudo configuration instead of this one.
            env={"PATH": privileged.DEFAULT_PATH},
            check=False,
        )
    except FileNotFoundError as exc:
        raise BackendError(f"the privileged helper cannot be run ({exc}): check GRIDGATE_PRIVILEGED_COMMAND") from None
    except subprocess.TimeoutExpired:
        text = f"the privileged helper did not answer {verb!r} within {timeout:g} s"
        raise BackendError(text, timeout=True) from None
    try:
        answer = json.loads(proc.stdout or "{}")
    except ValueError:
        answer = {}
    if proc.returncode != 0 or "error" in answer:
        text = answer.get("error") or (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        if answer.get("too_large"):
            raise ResultsTooLarge(text)
        raise BackendError(text)
    return answer


def helper_check(trusted: bool, *, cgroup: bool) -> Check:
    """doctor's line: the helper answers, speaks this protocol, runs as root (or the pool is
    trusted: it runs as the service) and, for local cases, can make a cgroup with the memory and
    pids controllers."""
    try:
        answer = call("version", {"probe_cgroup": cgroup}, timeout=60)
    except BackendError as exc:
        return Check("run as the owner", trusted, f"the privileged helper refused: {exc} (docs/deployment.md)")
    if not answer.get("root"):
        return Check(
            "run as the owner",
            trusted,
            "the privileged helper does not run as root: only trusted pools can run cases "
            "(set GRIDGATE_PRIVILEGED_COMMAND to the sudo rule, docs/deployment.md)",
        )
    if answer.get("seccomp") not in (None, "ok") and not trusted:
        return Check("run as the owner", False, f"{answer['seccomp']}: no case can start (docs/operations.md)")
    if answer.get("cgroup") not in (None, "ok"):
        return Check("run as the owner", False, f"{answer['cgroup']}: no case can start (docs/operations.md, 'Bounds')")
    return Check(
        "run as the owner",
        True,
        "the privileged helper runs as root"
        + (" and makes each case's cgroup" if cgroup else "")
        + (" and its syscall filter (no user namespaces)" if answer.get("seccomp") == "ok" else ""),
    )


def egress_check() -> Check:
    """doctor's line for a pool whose cases have the network: the helper can load their egress
    filter (nftables in the case's own network namespace)."""
    try:
        answer = call("version", {"probe_egress": True}, timeout=60)
    except BackendError as exc:
        return Check("egress filter", False, f"the privileged helper refused: {exc}")
    result = answer.get("egress")
    if result == "ok":
        return Check(
            "egress filter",
            True,
            "each case gets its own network namespace's filter: link-local, private, CGNAT and this host's "
            "addresses dropped unless the pool lists them",
        )
    return Check(
        "egress filter",
        False,
        f"{result or 'the privileged helper does not run as root'}: cases of this pool would reach link-local "
        "(cloud metadata), private and this host's own addresses, so none starts (docs/operations.md, 'Network')",
    )
