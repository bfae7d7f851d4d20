"""The launch specification of a class (R-LAUNCH): what a session or case asks the target for."""

import math
from decimal import Decimal

from apps.backends.base import CaseBounds
from apps.resources.models import SLURM_LIKE, PoolKind, ResourceClass

GB = 1 << 30


def _cpu(resource_class: ResourceClass):
    cpu = Decimal(resource_class.cpu)
    if resource_class.pool.kind in SLURM_LIKE:
        # Never under-provision: legacy fractional rows are rounded up, not truncated.
        return math.ceil(cpu)
    return int(cpu) if cpu == cpu.to_integral_value() else float(cpu)


def partition(resource_class: ResourceClass) -> str | None:
    pool_remote = resource_class.pool.remote or {}
    return resource_class.remote_value("partition") or pool_remote.get("partition")


def launch_spec(resource_class: ResourceClass) -> dict:
    pool = resource_class.pool
    pool_remote = pool.remote or {}
    cpu = _cpu(resource_class)
    resources = {"cpu": cpu, "memory": resource_class.memory, "gpu": resource_class.gpu}

    environment: dict[str, str] = {}
    if pool.kind == PoolKind.FIRECREST:
        environment["RSC_REMOTE_KIND"] = "firecrest"
        environment["RSC_FIRECREST_API_URL"] = pool_remote.get("api_url", "")
        environment["RSC_FIRECREST_SYSTEM_NAME"] = resource_class.remote_value("system_name") or pool_remote.get(
            "system_name", ""
        )
        part = partition(resource_class)
        if part:
            environment["RSC_FIRECREST_PARTITION"] = part
        environment["RSC_FIRECREST_FORWARD_RESOURCE_VALUES"] = (
            "true" if resource_class.forward_resource_values else "false"
        )
        environment["RSC_SESSION_CPU"] = str(cpu)
        environment["RSC_SESSION_MEMORY"] = str(resource_class.memory * 1024)
        environment["RSC_SESSION_GPUS"] = str(resource_class.gpu)
    elif pool.kind == PoolKind.RUNAI:
        environment["RSC_REMOTE_KIND"] = "runai"
        environment["RSC_RUNAI_BASE_URL"] = pool_remote.get("base_url", "")

    return {
        "resources": resources,
        "environment": environment,
        "batch_directives": batch_directives(resource_class),
    }


def batch_directives(resource_class: ResourceClass) -> list[str]:
    """``#SBATCH`` options for Slurm-like targets.

    Resources are forwarded only when the class asks for it; otherwise the partition decides,
    as on whole-node systems where asking for a slice is refused or wasteful.
    """
    pool = resource_class.pool
    if pool.kind not in SLURM_LIKE:
        return []
    directives = []
    part = partition(resource_class)
    if part:
        directives.append(f"--partition={part}")
    account = (pool.remote or {}).get("account")
    if account:
        directives.append(f"--account={account}")
    if resource_class.forward_resource_values:
        directives.append(f"--cpus-per-task={_cpu(resource_class)}")
        directives.append(f"--mem={resource_class.memory}G")
        if resource_class.gpu:
            directives.append(f"--gpus={resource_class.gpu}")
    return directives


def case_bounds(resource_class: ResourceClass) -> CaseBounds:
    """What one case of the class may use: its memory, CPU and tasks, its wall time (default and
    maximum) and its storage (disk and results)."""
    return CaseBounds(
        memory_bytes=resource_class.memory * GB,
        cpu=float(resource_class.cpu),
        tasks=resource_class.max_tasks,
        wall_seconds=resource_class.wall_time,
        max_wall_seconds=resource_class.max_wall_time,
        disk_bytes=resource_class.max_storage * GB,
    )
