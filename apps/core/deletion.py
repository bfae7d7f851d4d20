"""Deleting many rows (``manage.py cleanup``; the benches' resets)."""

from django.db import transaction

#: rows deleted per statement and transaction. Deleting a job also clears what points at it (a
#: charge's job: SET NULL), which Django writes as one statement naming every id deleted, and
#: PostgreSQL takes at most 65 535 parameters in one: a first run, or a busy week's backlog, failed
#: with every target after it.
BATCH = 10_000


def delete_in_batches(queryset) -> int:
    """Delete ``queryset``'s rows ``BATCH`` at a time, each batch its own transaction (so a long
    backlog holds no lock for long, and never sits in memory at once). Returns the rows deleted,
    those deleted with them (cascades) included, as ``QuerySet.delete`` counts them."""
    deleted = 0
    while True:
        with transaction.atomic():
            batch = list(queryset.order_by().values_list("pk", flat=True)[:BATCH])
            if not batch:
                return deleted
            deleted += queryset.model.objects.filter(pk__in=batch).delete()[0]
