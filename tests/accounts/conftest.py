"""Fixtures shared by the identity tests: the real test provider and its JWT double."""

from tests.accounts.test_oidc import issuer, provider  # noqa: F401 - fixtures
