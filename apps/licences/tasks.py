"""django-q2 entry points of the licence sync (thin)."""

from apps.licences import passes


def sync_pool(pool_id: int) -> str:
    return passes.sync_pool(pool_id)


def close_licences(licences: list[str], reservations: list[str]) -> None:
    passes.close_deleted(licences, reservations)
