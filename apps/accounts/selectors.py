"""Read queries on API tokens shared by the API and the user pages."""

from apps.accounts.models import ApiToken


def tokens_of(user):
    """``user``'s own tokens, newest first (the model's ordering), expired ones included until
    ``manage.py cleanup`` deletes them. Staff get only theirs too: operators have the admin."""
    return ApiToken.objects.filter(user_id=user.pk)
