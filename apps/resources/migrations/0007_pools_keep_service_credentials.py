"""Per-user credentials (docs/backends.md): a FirecREST or Qarnot pool without
``credentials`` in its ``remote`` now runs each case under its owner's own credentials. Pools that
existed before the option keep what they did, the service account, written out explicitly here."""

from django.db import migrations

KINDS = ("firecrest", "qarnot")


def keep_service_account(apps, schema_editor):
    pool_model = apps.get_model("resources", "ResourcePool")
    for pool in pool_model.objects.filter(kind__in=KINDS).only("id", "remote"):
        remote = pool.remote if isinstance(pool.remote, dict) else {}
        if "credentials" not in remote:
            pool_model.objects.filter(pk=pool.pk).update(remote={**remote, "credentials": "service"})


def forget_the_choice(apps, schema_editor):
    """Backwards: the code before the option reads no ``credentials`` key (and refuses unknown keys
    when a pool is saved): the explicit service choice is removed again."""
    pool_model = apps.get_model("resources", "ResourcePool")
    for pool in pool_model.objects.filter(kind__in=KINDS).only("id", "remote"):
        remote = pool.remote if isinstance(pool.remote, dict) else {}
        if remote.get("credentials") == "service":
            pool_model.objects.filter(pk=pool.pk).update(
                remote={key: value for key, value in remote.items() if key != "credentials"}
            )


class Migration(migrations.Migration):
    dependencies = [
        ("resources", "0006_paused_reason"),
    ]

    operations = [
        migrations.RunPython(keep_service_account, forget_the_choice),
    ]
