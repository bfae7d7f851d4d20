"""Periodic django-q2 schedules, created idempotently by data migrations (by name)."""


def ensure_schedule(apps, *, name: str, func: str, minutes: int = 1) -> None:
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name=name,
        defaults={"func": func, "schedule_type": "I", "minutes": minutes, "repeats": -1},
    )


def remove_schedule(apps, *, name: str) -> None:
    apps.get_model("django_q", "Schedule").objects.filter(name=name).delete()
