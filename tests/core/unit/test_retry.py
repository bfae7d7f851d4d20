"""``apps.core.retry.retry_aborted``: a transaction the database aborted as a whole (deadlock,
serialization failure) is run again, and past its attempts answers 503, never a 500. Driven
by stand-in errors: no database."""

import pytest
from django.db import OperationalError

from apps.core.exceptions import Unavailable
from apps.core.retry import is_retryable, retry_aborted


class Cause(Exception):
    def __init__(self, sqlstate):
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def aborted(sqlstate="40P01") -> OperationalError:
    error = OperationalError("aborted")
    error.__cause__ = Cause(sqlstate)
    return error


def failing(times: int, error_of=aborted):
    calls = []

    def func():
        calls.append(1)
        if len(calls) <= times:
            raise error_of()
        return "done"

    return func, calls


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_deadlock_or_serialization_failure_is_retryable(sqlstate):
    assert is_retryable(aborted(sqlstate))


def test_other_database_errors_are_not_retryable():
    assert not is_retryable(aborted("57P01"))
    assert not is_retryable(OperationalError("no cause"))
    assert not is_retryable(ValueError("40P01"))


def test_an_aborted_transaction_is_run_again_until_it_succeeds():
    func, calls = failing(2)
    assert retry_aborted(func, attempts=3) == "done"
    assert len(calls) == 3


def test_past_its_attempts_an_aborted_transaction_is_unavailable_not_a_server_error():
    func, calls = failing(5)
    with pytest.raises(Unavailable):
        retry_aborted(func, attempts=3)
    assert len(calls) == 3


def test_an_error_that_is_not_an_abort_passes_through_at_once():
    func, calls = failing(1, lambda: aborted("57P01"))
    with pytest.raises(OperationalError):
        retry_aborted(func)
    assert len(calls) == 1
