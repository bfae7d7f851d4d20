"""django-q2 entry points for sessions (thin)."""

from apps.sessions.services import expire_due_sessions


def expire_sessions() -> dict:
    """R-SESS-3 periodic sweep (every minute); admission also expires under its pool lock."""
    return expire_due_sessions()
