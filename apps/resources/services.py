"""State-changing operations on pools and classes."""

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction

from apps.core.exceptions import Conflict, InvalidFields
from apps.core.exceptions import field_errors as validation_error_dict
from apps.resources.models import ResourceClass, ResourcePool, default_class_message

QUOTA_FIELDS = {"quota_cpu": "quota", "quota_memory": "quota", "quota_gpu": "quota"}


def _api_errors(exc: DjangoValidationError) -> dict:
    errors = {}
    for key, messages in validation_error_dict(exc).items():
        errors.setdefault(QUOTA_FIELDS.get(key, key), []).extend(messages)
    return errors


def pool_for_edit(pk: int) -> ResourcePool:
    """The pool as it is now, its row held until the transaction commits, for an edit (the API's
    ``save_pool``, the admin page) to be checked against: another edit waits for this one. ``FOR
    NO KEY UPDATE`` does not hold up what only references the pool (admissions, reservations)."""
    return ResourcePool.objects.select_for_update(no_key=True).get(pk=pk)


def save_pool(
    *,
    pool: ResourcePool | None,
    fields: dict,
    users=None,
    groups=None,
    classes: list[dict] | None = None,
    actor=None,
) -> ResourcePool:
    """Create or update a pool and, in the same transaction, the classes given inline.

    R-POOL-6: class changes are applied before the pool-level checks (kind conversion, quota
    fit) run against the final set of classes, so one PATCH can change the kind and fix the
    classes. Any error rolls back everything: a refused request changes nothing. ``actor``: who
    asks (the admin history records a change of the provider URLs under their name).

    An existing pool is read again and only what this changes is written (``changed_columns``): the
    checks see the row as it is now, and a column someone else wrote since the caller read the
    pool (the accessibility a load sensor PUT, another operator's PATCH of another field) is never
    written back stale. The read locks the row until this commits (:func:`pool_for_edit`), so two
    edits at once are each checked against the other's result (a rule over two fields holds).
    """
    from apps.credentials.services import note_provider_url_change, provider_urls

    with transaction.atomic():
        if pool is not None and pool.pk:
            pool = pool_for_edit(pool.pk)
        pool = pool or ResourcePool()
        adding = pool._state.adding
        urls_before = provider_urls(pool) if pool.pk else None
        for name, value in fields.items():
            setattr(pool, name, value)
        pool._defer_class_checks = True
        try:
            pool.full_clean()
        except DjangoValidationError as exc:
            raise InvalidFields(_api_errors(exc)) from None
        pool.save(update_fields=None if adding else pool.changed_columns())
        if users is not None:
            pool.users.set(users)
        if groups is not None:
            pool.groups.set(groups)

        if classes:
            existing = {c.pk: c for c in pool.classes.all()}
            class_errors: list[dict] = []
            failed = False
            for entry in classes:
                entry = dict(entry)
                class_id = entry.pop("id", None)
                if class_id is not None and class_id not in existing:
                    class_errors.append({"id": [f"Class {class_id} is not in pool '{pool.name}'."]})
                    failed = True
                    continue
                item = existing.get(class_id) or ResourceClass()
                if item.pk and "default" not in entry:
                    # An earlier entry may have made another class the default, which demoted
                    # this one in the database: do not write the stale flag back.
                    item.refresh_from_db(fields=["default"])
                for name, value in entry.items():
                    setattr(item, name, value)
                item.pool = pool  # the in-memory pool: classes are checked against the new kind
                item._default_checked_as_set = True
                try:
                    item.full_clean()
                except DjangoValidationError as exc:
                    class_errors.append(validation_error_dict(exc))
                    failed = True
                    continue
                item.save()
                class_errors.append({})
            if failed:
                raise InvalidFields({"classes": class_errors})

        final = list(pool.classes.all())
        errors = {}
        try:
            check_class_set(final, pool.name)
        except DjangoValidationError as exc:
            errors["classes"] = exc.messages
        try:
            pool.clean_classes(final)
        except DjangoValidationError as exc:
            for key, messages in _api_errors(exc).items():
                errors.setdefault(key, []).extend(messages)
        if errors:
            raise InvalidFields(errors)
        if urls_before is not None:
            # Users' connections never follow the pool to other provider URLs (who changed them
            # and how is in the pool's admin history).
            note_provider_url_change(pool=pool, before=urls_before, actor=actor)
    return pool


def delete_class(resource_class: ResourceClass) -> None:
    """Delete a class; the default class goes only last (R-POOL-2)."""
    with transaction.atomic():
        pool = ResourcePool.objects.select_for_update().get(pk=resource_class.pool_id)
        others = pool.classes.exclude(pk=resource_class.pk)
        if resource_class.default and others.exists():
            raise Conflict(
                f"'{resource_class.name}' is the default class of pool '{pool.name}': make another "
                "class the default before deleting it (R-POOL-2)."
            )
        resource_class.delete()


def check_class_set(classes, pool_name: str) -> None:
    """R-POOL-2 on a pool's classes as a set, as they will be once saved: exactly one default. For
    the admin inline (its forms' instances) and ``save_pool`` (the pool's final classes)."""
    if classes and sum(1 for c in classes if c.default) != 1:
        raise DjangoValidationError({NON_FIELD_ERRORS: [default_class_message(pool_name)]})
