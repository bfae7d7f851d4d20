"""Validation of the per-kind ``remote`` configuration of pools and classes (SPEC §3).

Every key is validated and unknown keys are rejected, so a typo in an admin form never silently
turns into "use the default". Secrets are never stored (R-POOL-7): only the *names* of the
environment variables that hold them.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apps.core import credentials, outbound
from apps.core.text import has_control_characters

# Matched with fullmatch: ``$`` would also accept a trailing newline.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
SAFE_PATH = re.compile(r"/[A-Za-z0-9_.,+=@%/-]*")
SECRET_WORDS = ("token", "secret", "password", "key")
SECRET_ALLOWED = {"token_uri"}


class RemoteError(Exception):
    """One message about the ``remote`` field."""


def _no_control_characters(value: str) -> str:
    """R-BACK-6: remote values reach job scripts, #SBATCH lines and SDK calls: a newline there
    would start a new directive or command, so it is refused here, at write time."""
    if has_control_characters(value):
        raise RemoteError("must not contain control characters (newlines, tabs…)")
    return value


def _https_url(value: Any) -> str:
    # The one copy of the outbound scheme rule (apps.core.outbound), also applied to webhooks.
    try:
        return outbound.check_url(value)
    except outbound.OutboundRefused as exc:
        raise RemoteError(str(exc)) from None


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise RemoteError("must be a non-empty string of at most 255 characters")
    return _no_control_characters(value)


def _matching(pattern: re.Pattern, message: str) -> Callable[[Any], str]:
    """A check for text that must match ``pattern`` whole, refused with ``message`` otherwise."""

    def check(value: Any) -> str:
        value = _text(value)
        if not pattern.fullmatch(value):
            raise RemoteError(message)
        return value

    return check


# A partition or account: it becomes an ``#SBATCH`` value, which sbatch reads without any shell
# quoting, so only the characters Slurm names use are accepted (R-BACK-6).
_slurm_name = _matching(SLURM_NAME, "must be a Slurm name: letters, digits and . _ + - only (at most 64)")


def _env_name(value: Any) -> str:
    problem = credentials.name_problem(value)
    if problem:
        raise RemoteError(problem)
    return value


def _abs_path(value: Any) -> str:
    value = _text(value)
    if not value.startswith("/"):
        raise RemoteError("must be an absolute path")
    if not SAFE_PATH.fullmatch(value):
        # It is written into #SBATCH --output/--chdir lines, which no shell quoting protects.
        raise RemoteError("must be a path of letters, digits and / . _ , + = @ % - only (no spaces or quotes)")
    return value


#: Kubernetes names (projects, node pools: RFC 1123 labels) and Run:AI cluster ids (UUIDs)
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
#: a container image reference: registry/repository[:tag][@digest], no spaces or shell characters
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")


_k8s_name = _matching(K8S_NAME, "must be a Kubernetes name: lowercase letters, digits and - (at most 63)")
_uuid = _matching(UUID, "must be a UUID (the cluster's id as Run:AI shows it)")
_image = _matching(IMAGE, "must be a container image reference (registry/repository:tag), without spaces")


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RemoteError("must be a whole number of at least 1")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise RemoteError("must be true or false")
    return value


#: whose credentials a remote pool's jobs run under (docs/backends.md, "Per-user credentials")
USER = "user"
SERVICE = "service"
CREDENTIAL_MODES = (USER, SERVICE)
#: OAuth client ids and scopes as providers spell them (Keycloak: letters, digits, ``_.:-``)
CLIENT_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,255}")
SCOPE = re.compile(r"[\x21\x23-\x5B\x5D-\x7E]+( [\x21\x23-\x5B\x5D-\x7E]+)*")


def _credential_mode(value: Any) -> str:
    if value not in CREDENTIAL_MODES:
        raise RemoteError(
            "must be 'user' (each user's own credentials: jobs run under the user's account at the provider) "
            "or 'service' (the pool's service account runs every user's jobs)"
        )
    return value


_client_id = _matching(CLIENT_ID, "must be an OAuth client id: letters, digits and _ . : @ - only")
_scope = _matching(SCOPE, "must be OAuth scopes separated by single spaces (e.g. 'openid offline_access')")


@dataclass(frozen=True)
class Key:
    check: Callable[[Any], Any]
    required: bool = False
    default: Any = None


POOL_REMOTE_KEYS: dict[str, dict[str, Key]] = {
    "local": {},
    "firecrest": {
        "api_url": Key(_https_url, required=True),
        "system_name": Key(_text, required=True),
        "partition": Key(_slurm_name),
        "token_uri": Key(_https_url, required=True),
        "account": Key(_slurm_name),
        "working_root": Key(_abs_path),
        "client_id_env": Key(_env_name, default=f"{credentials.PREFIX}FIRECREST_CLIENT_ID"),
        "client_secret_env": Key(_env_name, default=f"{credentials.PREFIX}FIRECREST_CLIENT_SECRET"),
        # Per-user credentials (docs/backends.md): "user" unless the pool says "service"; pools
        # saved before the option have "service" written by resources.0007.
        "credentials": Key(_credential_mode, default=USER),
        "authorization_uri": Key(_https_url),  # default: Keycloak's, next to token_uri
        "revocation_uri": Key(_https_url),  # default: Keycloak's, next to token_uri
        "public_client_id": Key(_client_id, default="gridgate-firecrest"),
        "scope": Key(_scope, default="openid offline_access"),
    },
    "slurm": {
        "partition": Key(_slurm_name),
        "account": Key(_slurm_name),
        "working_root": Key(_abs_path),
    },
    "runai": {
        "base_url": Key(_https_url, required=True),
        "project": Key(_k8s_name),
        # Cases (docs/backends.md, "runai"): the image every case runs in, the cluster (default:
        # the project's), the node pool (default: the project's order), and the shared volume the
        # results come back through: ``host_path`` on the cluster's nodes is ``working_root`` here.
        "image": Key(_image),
        "cluster_id": Key(_uuid),
        "node_pool": Key(_k8s_name),
        "working_root": Key(_abs_path),
        "host_path": Key(_abs_path),
        "mount_path": Key(_abs_path, default="/gridgate"),
        "client_id_env": Key(_env_name, default=f"{credentials.PREFIX}RUNAI_CLIENT_ID"),
        "client_secret_env": Key(_env_name, default=f"{credentials.PREFIX}RUNAI_CLIENT_SECRET"),
        "credentials": Key(_credential_mode, default=USER),
    },
    "qarnot": {
        "profile": Key(_text, required=True),
        "docker_image": Key(_text),
        "cluster_url": Key(_https_url),
        "snapshot_interval": Key(_positive_int, default=60),
        "max_upload_mb": Key(_positive_int, default=512),
        "token_env": Key(_env_name, default=f"{credentials.PREFIX}QARNOT_TOKEN"),
        "credentials": Key(_credential_mode, default=USER),
    },
}

#: pool kinds whose jobs run under a provider credential, the service's or each user's: those
#: whose ``remote`` takes ``credentials``
CREDENTIAL_KINDS = tuple(kind for kind, keys in POOL_REMOTE_KEYS.items() if "credentials" in keys)

CLASS_REMOTE_KEYS: dict[str, Key] = {
    "system_name": Key(_text),
    "partition": Key(_slurm_name),
    "forward_resource_values": Key(_bool, default=False),
}


def looks_like_secret(key: str) -> bool:
    lowered = key.lower()
    if lowered in SECRET_ALLOWED or lowered.endswith("_env"):
        return False
    return any(word in lowered for word in SECRET_WORDS)


def secret_message(key: str, kind: str) -> str:
    env_keys = [name for name in POOL_REMOTE_KEYS.get(kind, {}) if name.endswith("_env")]
    if f"{key}_env" in env_keys:
        where = f"set '{key}_env' to the name of the environment variable that holds it"
    elif env_keys:
        where = (
            "set "
            + " / ".join(f"'{name}'" for name in env_keys)
            + (" to the name of the environment variable that holds it")
        )
    else:
        where = "keep it in an environment variable of the worker hosts"
    return f"'{key}' looks like a credential, and credentials are never stored: {where} (R-POOL-7)."


def validate_pool_remote(kind: str, remote: dict) -> list[str]:
    """Return the problems with a pool ``remote`` for ``kind`` (empty list when valid)."""
    if not isinstance(remote, dict):
        return ["must be a JSON object"]
    if kind not in POOL_REMOTE_KEYS:
        return []  # the kind field reports the bad kind
    schema = POOL_REMOTE_KEYS[kind]
    problems = []
    for key in remote:
        if looks_like_secret(key):
            problems.append(secret_message(key, kind))
    if problems:
        return problems
    if kind == "local" and remote:
        return ["a local pool takes no remote configuration: leave it empty"]
    for key, value in remote.items():
        spec = schema.get(key)
        if spec is None:
            problems.append(f"unknown key '{key}' for a {kind} pool; accepted: {', '.join(schema)}")
            continue
        try:
            spec.check(value)
        except RemoteError as exc:
            problems.append(f"'{key}' {exc}")
    for key, spec in schema.items():
        if spec.required and key not in remote:
            problems.append(f"'{key}' is required for a {kind} pool")
    per_user_firecrest = not problems and kind == "firecrest" and credential_mode(kind, remote) == USER
    if per_user_firecrest and authorization_endpoint(remote) is None:
        problems.append(
            "'authorization_uri' is required for per-user credentials ('credentials': 'user') when 'token_uri' "
            "does not end with /token: set the identity provider's authorization endpoint (Keycloak: "
            "…/protocol/openid-connect/auth), or 'credentials': 'service' to run jobs under the service account"
        )
    per_user_runai = not problems and kind == "runai" and credential_mode(kind, remote) == USER
    if per_user_runai and not remote.get("project"):
        problems.append(
            "'project' is required for per-user credentials ('credentials': 'user'): each user's access key "
            "sees its own projects, so the pool names the one its cases run in"
        )
    if kind == "runai" and not problems and bool(remote.get("working_root")) != bool(remote.get("host_path")):
        problems.append(
            "'working_root' and 'host_path' go together: the shared volume as Gridgate's hosts see it and as "
            "the cluster's nodes see it"
        )
    return problems


def credential_mode(kind: str, remote: dict | None) -> str | None:
    """Whose credentials ``kind``'s jobs run under: ``user``, ``service``, or None for kinds that
    use no provider credential. A remote without the key is ``user`` (pools saved before the
    option got ``service`` written by a data migration)."""
    if kind not in CREDENTIAL_KINDS:
        return None
    value = (remote or {}).get("credentials", USER)
    return value if value in CREDENTIAL_MODES else USER


def authorization_endpoint(remote: dict | None) -> str | None:
    """The identity provider's authorization endpoint for the connect flow: the pool's
    ``authorization_uri``, else Keycloak's beside the pool's ``token_uri`` (``…/token`` →
    ``…/auth``), else None."""
    return _beside_token_uri(remote, "authorization_uri", "auth")


def revocation_endpoint(remote: dict | None) -> str | None:
    """The identity provider's token revocation endpoint (RFC 7009), where disconnecting revokes
    the grant: the pool's ``revocation_uri``, else Keycloak's beside the pool's ``token_uri``
    (``…/token`` → ``…/revoke``), else None."""
    return _beside_token_uri(remote, "revocation_uri", "revoke")


def _beside_token_uri(remote: dict | None, key: str, last: str) -> str | None:
    remote = remote or {}
    if remote.get(key):
        return remote[key]
    token_uri = remote.get("token_uri")
    if isinstance(token_uri, str) and token_uri.rstrip("/").endswith("/token"):
        return token_uri.rstrip("/")[: -len("token")] + last
    return None


def with_defaults(kind: str, remote: dict | None) -> dict:
    """The pool's remote configuration with documented defaults filled in."""
    out = {key: spec.default for key, spec in POOL_REMOTE_KEYS.get(kind, {}).items() if spec.default is not None}
    out.update(remote or {})
    return out


def validate_class_remote(remote: dict) -> list[str]:
    if not isinstance(remote, dict):
        return ["must be a JSON object or null"]
    problems = []
    for key, value in remote.items():
        if looks_like_secret(key):
            problems.append(secret_message(key, "slurm"))
            continue
        spec = CLASS_REMOTE_KEYS.get(key)
        if spec is None:
            problems.append(f"unknown key '{key}'; accepted: {', '.join(CLASS_REMOTE_KEYS)}")
            continue
        try:
            spec.check(value)
        except RemoteError as exc:
            problems.append(f"'{key}' {exc}")
    return problems
