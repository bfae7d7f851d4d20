"""The part every remote provider (FirecREST, Qarnot, Run:AI) shares: a :class:`RemoteSession`
(whose credential, one client per credential, errors and secrets) and a :class:`RemoteBackend`
(the ``doctor`` skeleton). A provider package fills their hooks; docs/backends.md, "Adding a
remote provider", says which."""

from apps.backends.remote.backend import RemoteBackend
from apps.backends.remote.session import Failure, Paste, ProviderError, RemoteSession, clear_clients, provider

__all__ = ["Failure", "Paste", "ProviderError", "RemoteBackend", "RemoteSession", "clear_clients", "provider"]
