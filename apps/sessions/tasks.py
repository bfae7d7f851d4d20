"""django-q2 entry points for sessions (thin)."""

from apps.sessions.services import expire_due_sessions, recount_usage


def expire_sessions() -> dict:
    """R-SESS-3's periodic sweep (every minute), then the recount of every pool's usage counters
    (R-SESS-1); admission also expires a pool's due sessions when they stand in its way."""
    return {**expire_due_sessions(), "usage_repaired": recount_usage()}
