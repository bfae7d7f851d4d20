"""django-q2 entry points for sessions (thin)."""

from apps.sessions.services import end_sessions_without_access, expire_due_sessions, recount_usage


def expire_sessions() -> dict:
    """R-SESS-3's periodic sweep (every minute), then the recount of every pool's usage counters
    (R-SESS-1); admission also expires a pool's due sessions when they stand in its way. Also the
    repair of R-POOL-8's revocation, should a process have died between a withdrawn grant's
    commit and its revocation (``apps.sessions.receivers``)."""
    return {
        **expire_due_sessions(),
        "usage_repaired": recount_usage(),
        "access_withdrawn": end_sessions_without_access(),
    }
