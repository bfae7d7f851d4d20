"""Common and all-digit passwords are refused wherever passwords are validated."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command


@pytest.mark.parametrize(
    "password, code",
    [
        ("password123", "password_too_common"),
        ("qwertyuiop", "password_too_common"),
        ("4829175036", "password_entirely_numeric"),
    ],
)
def test_common_and_numeric_passwords_are_refused(password, code):
    with pytest.raises(ValidationError) as raised:
        validate_password(password)
    assert code in {error.code for error in raised.value.error_list}


def test_a_long_uncommon_password_is_accepted():
    validate_password("quartz-lantern-meadow-71")


@pytest.mark.django_db
def test_the_demo_still_creates_its_accounts_with_their_well_known_passwords():
    """``manage.py demo`` sets them with set_password, which validates nothing: `make run` keeps alice/alice."""
    call_command("demo", "--force")
    alice = get_user_model().objects.get(username="alice")
    assert alice.check_password("alice")
    with pytest.raises(ValidationError):
        validate_password("alice", user=alice)
