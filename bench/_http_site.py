"""The site bench/http_load.py measures, made in a database through a checkout's own code.

Run by http_load.py as ``python bench/_http_site.py`` with the checkout to prepare as the
working directory (this tree's, or the baseline's of an A/B run: ``BENCH_HTTP_BASELINE``) and
``DATABASE_URL`` naming the bench database; reads its options as JSON on stdin and prints the
site as JSON on stdout. Only calls every measured checkout has (models, ``issue_token``,
``services.admit``), so one script prepares both sides of an A/B run alike.

The site: a pool with an emulator device and room for every client; one user per client (its
own token, Unix uid and identity at the bench's JWT issuer, and a session held for submissions);
a user whose acquire+release cycles the ``cycles`` figure measures. With ``history``, a second
pool like the first whose cycling user has ended ``history_sessions`` sessions there (each with a
scheduler job id) and whose history holds ``history_jobs`` finished jobs: the ``cycles_history``
figure against ``cycles`` is the cost of history.
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())  # the checkout to prepare, not this script's own
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.accounts.models import Identity  # noqa: E402
from apps.accounts.services import issue_token  # noqa: E402
from apps.core.api.views import WRITE_FLOOR_TABLE, WRITE_FLOOR_TABLE_SQL  # noqa: E402
from apps.qrmi.models import UnixAccount  # noqa: E402
from apps.resources.models import ResourceClass, ResourcePool  # noqa: E402
from apps.scheduling.models import Device, Job  # noqa: E402
from apps.sessions import services  # noqa: E402
from apps.sessions.models import Session  # noqa: E402

CLIENT_UID = 70000  # client i is uid 70000 + i (munge signs for any uid through setpriv)
CYCLER_UID, HISTORY_UID = 69998, 69999


def pool(name: str):
    made = ResourcePool.objects.create(name=name, kind="local", public=True, slots_total=1_000_000)
    klass = ResourceClass.objects.create(pool=made, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=made, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    return made, klass


def user(username: str, uid: int, issuer: str) -> dict:
    made, _ = get_user_model().objects.get_or_create(username=username)
    UnixAccount.objects.filter(unix_uid=uid).exclude(user=made).delete()
    UnixAccount.objects.update_or_create(user=made, defaults={"unix_uid": uid})
    Identity.objects.update_or_create(issuer=issuer, subject=username, defaults={"user": made})
    return {"username": username, "uid": uid, "token": issue_token(made, name="bench http_load")[1], "obj": made}


def fill(model, template, count: int, computed: dict[str, str], source: str = "") -> None:
    """``count`` rows of ``model`` like ``template`` in one INSERT … SELECT over
    ``generate_series(1, count) g`` (``source`` may join more), the columns of ``computed`` set
    by their SQL expressions instead: whatever columns the checkout's model has."""
    fields = [
        field for field in model._meta.concrete_fields if not (field.primary_key and field.column not in computed)
    ]
    columns, values, params = [], [], []
    for field in fields:
        columns.append(connection.ops.quote_name(field.column))
        if field.column in computed:
            values.append(computed[field.column])
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.pre_save(template, True), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) SELECT {', '.join(values)}"  # noqa: S608
            f" FROM generate_series(1, {int(count)}) g {source}",
            params,
        )


def history(made_pool, klass, owner, sessions: int, jobs: int) -> None:
    now = timezone.now()
    ended = Session(
        user=owner,
        resource_class=klass,
        pool=made_pool,
        status="revoked",
        revoked_at=now,
        revocation_reason="released",
        created_at=now,
        last_activity_at=now,
        expires_at=now,
        idle_expires_at=now,
        launch_spec={},
    )
    fill(Session, ended, sessions, {"id": "gen_random_uuid()", "external_id": "'hist-' || g"})
    done = Job(pool=made_pool, user=owner, payload={}, shots=1, status="completed", created_at=now, finished_at=now)
    spread = (
        f"JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {Session._meta.db_table}"  # noqa: S608
        f" WHERE pool_id = {int(made_pool.pk)} AND status = 'revoked') s ON s.n = 1 + g %% {int(sessions)}"
    )
    fill(Job, done, jobs, {"session_id": "s.id"}, spread)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def main() -> None:
    options = json.load(sys.stdin)
    call_command("migrate", verbosity=0)
    issuer, clients = options["issuer"], options["clients"]
    names = [options["pool"], options["pool"] + "-history"]
    _, klass = pool(names[0])
    site = {"pool": names[0], "class_id": klass.pk, "clients": []}
    for i in range(clients):
        one = user(f"bench-http-{i}", CLIENT_UID + i, issuer)
        one["session"] = str(services.admit(user=one.pop("obj"), resource_class=klass, slots=1).session.pk)
        site["clients"].append(one)
    cycler = user("bench-http-cycler", CYCLER_UID, issuer)
    cycler.pop("obj")
    site["cycler"] = cycler
    if options.get("history_sessions"):
        history_pool, history_class = pool(names[1])
        owner = user("bench-http-history", HISTORY_UID, issuer)
        history(history_pool, history_class, owner.pop("obj"), options["history_sessions"], options["history_jobs"])
        site.update(history_pool=names[1], history_class_id=history_class.pk, history_user=owner)
    with connection.cursor() as cursor:  # afresh: a run that died before its drop leaves rows
        cursor.execute(f"DROP TABLE IF EXISTS {WRITE_FLOOR_TABLE}")
        cursor.execute(WRITE_FLOOR_TABLE_SQL)
    json.dump(site, sys.stdout)


if __name__ == "__main__":
    main()
