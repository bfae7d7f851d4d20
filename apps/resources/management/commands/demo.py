"""``manage.py demo``: demo users, pools and classes, and six days of past activity for the
utilization charts. Safe to re-run (updates in place; the history is written once)."""

import random
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from apps.resources.models import ResourceClass, ResourcePool

DEMO_USERS = [
    # username, password, is_staff
    ("admin", "admin", True),
    ("alice", "alice", False),
    ("bob", "bob", False),
]

DEMO_POOLS = [
    {
        # R-CASE-8: a trusted single-user pool, so `make run` works for a developer who is not
        # root (cases run as the developer's own account); never public, granted to the demo
        # users. A real deployment links users to Unix accounts instead (docs/operations.md).
        "pool": {
            "name": "local",
            "kind": "local",
            "public": False,
            "default": False,
            "trusted": True,
            "remote": {},
            "accessibility_message": "Trusted single-user demo pool: cases run as the service's own account.",
        },
        "users": ["admin", "alice", "bob"],
        "classes": [
            {"name": "small", "cpu": 1, "memory": 2, "default": True},
            {"name": "medium", "cpu": 2, "memory": 4},
        ],
    },
    {
        "pool": {
            "name": "qpu",
            "kind": "local",
            "public": False,
            "slots_total": 10,
            "strategy": "weighted_fair",
            "remote": {},
            "accessibility_message": "Emulated QPU for the demo.",
        },
        "groups": ["qpu-users"],
        "classes": [{"name": "qpu-access", "cpu": 1, "memory": 1, "default": True}],
    },
    {
        "pool": {
            "name": "alps",
            "kind": "firecrest",
            "public": True,
            "remote": {
                "api_url": "https://api.cscs.ch/hpc/firecrest/v2",
                "token_uri": "https://auth.cscs.ch/auth/realms/firecrest-clients/protocol/openid-connect/token",
                "system_name": "daint",
                "partition": "normal",
                "working_root": "/capstor/scratch/gridgate",
            },
        },
        "classes": [
            {"name": "daint-node", "cpu": 288, "memory": 460, "gpu": 4, "default": True},
            {
                "name": "eiger-debug",
                "cpu": 8,
                "memory": 16,
                "remote": {"system_name": "eiger", "partition": "debug", "forward_resource_values": True},
            },
        ],
    },
    {
        "pool": {
            "name": "slurm",
            "kind": "slurm",
            "public": True,
            "remote": {"partition": "debug", "working_root": "/var/lib/gridgate/slurm"},
        },
        "classes": [
            {
                "name": "one-core",
                "cpu": 1,
                "memory": 1,
                "default": True,
                "remote": {"forward_resource_values": True},
            },
            {"name": "whole-node", "cpu": 2, "memory": 2},
        ],
    },
    {
        "pool": {
            "name": "qarnot",
            "kind": "qarnot",
            "public": True,
            "quota_cpu": 64,
            "quota_memory": 256,
            "quota_gpu": 0,
            "remote": {"profile": "docker-batch", "docker_image": "ubuntu:24.04"},
        },
        "classes": [
            {"name": "cpu-16", "cpu": 16, "memory": 32, "default": True},
            {"name": "cpu-32", "cpu": 32, "memory": 64},
        ],
    },
]


class Command(BaseCommand):
    help = "Create or update the demo users, pools and classes."

    def add_arguments(self, parser):
        parser.add_argument(
            "--force", action="store_true", help="Run even with DEBUG off (it creates accounts with known passwords)."
        )

    @transaction.atomic
    def handle(self, *args, force=False, **options):
        if not settings.DEBUG and not force:
            raise CommandError(
                "demo creates accounts with well-known passwords: it runs with DEBUG=true (make run) or --force."
            )
        User = get_user_model()
        users = {}
        for username, password, staff in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:  # an existing account keeps its password and rights
                user.is_staff = staff
                user.is_superuser = staff
                user.set_password(password)
                user.save()
            users[username] = user
            self.stdout.write(f"{'created' if created else 'kept existing'} user {username}")
        qpu_users, _ = Group.objects.get_or_create(name="qpu-users")
        qpu_users.user_set.add(users["alice"])

        for spec in DEMO_POOLS:
            fields = dict(spec["pool"])
            name = fields.pop("name")
            pool = ResourcePool.objects.filter(name=name).first() or ResourcePool(name=name)
            for key, value in fields.items():
                setattr(pool, key, value)
            pool.full_clean()
            pool.save()
            if spec.get("groups"):
                pool.groups.set(Group.objects.filter(name__in=spec["groups"]))
            if spec.get("users"):
                pool.users.set([users[name] for name in spec["users"]])
            for class_fields in spec["classes"]:
                class_fields = dict(class_fields)
                cname = class_fields.pop("name")
                item = pool.classes.filter(name=cname).first() or ResourceClass(pool=pool, name=cname)
                for key, value in class_fields.items():
                    setattr(item, key, value)
                item._default_checked_as_set = True
                item.full_clean()
                item.save()
            self.stdout.write(f"pool {pool.name} ({pool.kind}): {pool.classes.count()} classes")
        from apps.scheduling.models import Device

        qpu = ResourcePool.objects.get(name="qpu")
        device, created = Device.objects.update_or_create(
            pool=qpu,
            name="emulator",
            defaults={"driver": "emulator", "config": {"pulser_device": "AnalogDevice"}, "online": True},
        )
        self.stdout.write(f"{'created' if created else 'updated'} device qpu/emulator (Pulser AnalogDevice)")
        self.stdout.write(history(qpu, device, ResourcePool.objects.get(name="local"), users))
        self.stdout.write(self.style.SUCCESS("Demo data ready."))
        self.stdout.write("Logins: admin/admin (staff), alice/alice (qpu-users), bob/bob")


HISTORY_MARK = "demo-history-"  # external id prefix of the past sessions: written once


def history(qpu, device, local, users) -> str:
    """Six days of past sessions, jobs and cases (all finished), so ``/utilization/`` shows
    something after ``make run``. Jobs run one at a time on the emulator: each is dispatched when
    the device frees up, so bursts make real queue waits. Bulk inserts: a fraction of a second."""
    from apps.cases.models import Case, CaseStatus
    from apps.scheduling.models import Job, JobStatus
    from apps.sessions.models import RevocationReason, Session, SessionStatus

    if Session.objects.filter(pool=qpu, external_id__startswith=HISTORY_MARK).exists():
        return "kept existing demo history"
    rng = random.Random(17)  # demo data, the same on every machine
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(days=6)
    qpu_class = qpu.classes.get(default=True)
    people = [users["alice"], users["admin"]]
    sessions, jobs, free_at = [], [], start
    opened = start + timedelta(minutes=20)
    for i in range(40):
        user = people[i % 2]
        length = timedelta(minutes=rng.randint(40, 200))
        session = Session(
            user=user,
            resource_class=qpu_class,
            pool=qpu,
            slots=rng.choice([1, 1, 2, 3]),
            external_id=f"{HISTORY_MARK}{i}",
            status=SessionStatus.REVOKED,
            created_at=opened,
            last_activity_at=opened + length,
            expires_at=opened + timedelta(hours=8),
            idle_expires_at=opened + length,
            revoked_at=opened + length,
            revocation_reason=RevocationReason.RELEASED,
            launch_spec={},
        )
        sessions.append(session)
        submitted = opened + timedelta(minutes=2)
        for _ in range(rng.randint(4, 14)):  # a burst: they queue behind each other
            submitted += timedelta(seconds=rng.randint(5, 90))
            dispatched = max(submitted + timedelta(seconds=rng.randint(1, 4)), free_at)
            runtime = rng.randint(20, 240)
            finished = dispatched + timedelta(seconds=runtime)
            if finished >= now:
                break
            free_at = finished
            outcome = rng.choices([JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED], [17, 2, 1])[0]
            shots = rng.choice([100, 200, 500])
            jobs.append(
                Job(
                    session=session,
                    pool=qpu,
                    user=user,
                    payload={"sequence": "{}"},
                    shots=shots,
                    status=outcome,
                    device=device,
                    remote_id=f"demo-{session.external_id}-{len(jobs)}",
                    created_at=submitted,
                    scheduled_at=dispatched,
                    started_at=dispatched,
                    finished_at=finished,
                    runtime_seconds=float(runtime),
                    result={"counts": {"00": shots // 2, "11": shots - shots // 2}}
                    if outcome == JobStatus.COMPLETED
                    else None,
                    error="" if outcome == JobStatus.COMPLETED else f"demo: {outcome}",
                )
            )
        opened += timedelta(minutes=rng.randint(90, 300))
        if opened + timedelta(hours=4) >= now:
            break
    Session.objects.bulk_create(sessions)
    Job.objects.bulk_create(jobs)

    local_class = local.classes.get(default=True)
    cases = []
    for i in range(24):
        created = start + timedelta(hours=rng.uniform(1, 140))
        status = rng.choices([CaseStatus.DONE, CaseStatus.FAILED, CaseStatus.CANCELLED], [10, 3, 1])[0]
        cases.append(
            Case(
                owner=people[i % 2],
                resource_class=local_class,
                name=f"demo-run-{i + 1}",
                command="python simulate.py",
                status=status,
                backend="local",
                remote_id=f"demo-{i}",
                progress=1.0 if status == CaseStatus.DONE else None,
                results_fetched=status == CaseStatus.DONE,
                execution_time=rng.uniform(30, 900),
                submitted_at=created,
                finished_at=created + timedelta(minutes=20),
            )
        )
    Case.objects.bulk_create(cases)  # created_at is auto_now_add: set it afterwards
    for case in cases:
        case.created_at = case.submitted_at
    Case.objects.bulk_update(cases, ["created_at"])
    return f"demo history: {len(sessions)} sessions and {len(jobs)} jobs on qpu, {len(cases)} cases on local"
