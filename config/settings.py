"""Gridgate settings. Everything deployment-specific comes from environment variables."""

import re
import socket
from datetime import timedelta
from pathlib import Path

from config.env import (
    embedded_secret_key,
    env_bool,
    env_choice,
    env_database,
    env_int,
    env_int_list,
    env_list,
    env_mapping,
    env_networks,
    env_proxy_networks,
    env_str,
    with_query_defaults,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GRIDGATE_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY") or embedded_secret_key(VAR_DIR / "secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
# Origins (scheme://host[:port]) of the site as browsers see it behind a proxy, for CSRF.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# HTTPS (docs/deployment.md). GRIDGATE_HTTPS=true when users reach the site over TLS (directly or
# through a TLS-terminating proxy): secure cookies, redirect to https, HSTS. Off by default so that
# `make run` and the tests work over plain http; `manage.py check --deploy` reports it while off.
GRIDGATE_HTTPS = env_bool("GRIDGATE_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = GRIDGATE_HTTPS
SECURE_SSL_REDIRECT = GRIDGATE_HTTPS
# Prometheus scrapes each gunicorn directly over plain http (docs/metrics.md): a redirect to https
# would fail every scrape. /metrics carries no cookie and its token is the scraper's own secret,
# sent on the private network the scrape uses.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("GRIDGATE_HSTS_SECONDS", 31_536_000 if GRIDGATE_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("GRIDGATE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("GRIDGATE_HSTS_PRELOAD", False)
# Only behind a proxy that always sets (and never passes on a client's) X-Forwarded-Proto:
# otherwise any client could claim https. Without it, the https redirect loops behind such a proxy.
if env_bool("GRIDGATE_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "django_htmx",
    "axes",
    "csp",
    "apps.core",
    "apps.accounts",
    "apps.resources",
    "apps.sessions",
    "apps.scheduling",
    "apps.accounting",
    "apps.backends",
    "apps.credentials",
    "apps.cases",
    "apps.web",
    "apps.qrmi",
    "apps.licences",
    "apps.reservations",
    "apps.notifications",
    "apps.metrics",
    "apps.allocations",
]

MIDDLEWARE = [
    # Outermost: times every request, including redirects and errors of the middleware below.
    "apps.metrics.middleware.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the web process itself (collected into STATIC_ROOT), before anything
    # that would touch the session or the database.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Early, so it also sees the error pages of the middleware below (never HTML on API paths).
    "apps.core.middleware.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Users signed in with the identity provider are sent back to it (prompt=none) once their
    # ID token is older than OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS: an account disabled there loses
    # the user pages then. Only for sessions signed in with the provider.
    "mozilla_django_oidc.middleware.SessionRefresh",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every answer (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: turns a login response it flagged as locked out into a 429
    # (apps.accounts.lockout.lockout_response).
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # Before anything else: every login attempt counts against its client address's rate,
    # whatever the username, and past it none reaches a password hash (apps/accounts/lockout.py).
    "apps.accounts.lockout.LoginRateBackend",
    # First: refuses a locked-out username and address before any password is checked, and needs
    # the request (authenticate(request=...): every login path here passes it).
    "axes.backends.AxesStandaloneBackend",
    # Local passwords, as GRIDGATE_PASSWORD_LOGIN allows them (below).
    "apps.accounts.backends.PasswordBackend",
    # Sign-in with the centre's identity provider, when GRIDGATE_OIDC_ISSUER is set.
    "apps.accounts.oidc.OidcBackend",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env_database("DATABASE_URL", VAR_DIR / "gridgate.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# API tokens (apps.accounts): each login issues one, valid this many days.
GRIDGATE_TOKEN_DAYS = env_int("GRIDGATE_TOKEN_DAYS", 90, minimum=1)
GRIDGATE_TOKEN_MAX_DAYS = env_int("GRIDGATE_TOKEN_MAX_DAYS", 365, minimum=1)

# Local passwords (docs/identity.md): "on" for everyone, "staff" for staff and superusers only
# (break-glass accounts beside the identity provider), "off" for nobody. Every password path
# (user pages, admin, POST /api/v1/auth/token/) follows it: apps.accounts.backends.
GRIDGATE_PASSWORD_LOGIN = env_choice("GRIDGATE_PASSWORD_LOGIN", "on", ["on", "staff", "off"])

# Sign-in with the centre's OpenID Connect provider (mozilla-django-oidc, authorization code +
# PKCE) and API bearer tokens it issues, validated here against its keys (docs/identity.md). Off
# while GRIDGATE_OIDC_ISSUER is empty. The endpoints default to Keycloak's under the issuer.
GRIDGATE_OIDC_ISSUER = (env_str("GRIDGATE_OIDC_ISSUER") or "").rstrip("/")
GRIDGATE_OIDC_NAME = env_str("GRIDGATE_OIDC_NAME", "the centre's sign-in")
_oidc = f"{GRIDGATE_OIDC_ISSUER}/protocol/openid-connect"
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("GRIDGATE_OIDC_AUTHORIZATION_ENDPOINT", f"{_oidc}/auth")
OIDC_OP_TOKEN_ENDPOINT = env_str("GRIDGATE_OIDC_TOKEN_ENDPOINT", f"{_oidc}/token")
OIDC_OP_USER_ENDPOINT = env_str("GRIDGATE_OIDC_USERINFO_ENDPOINT", f"{_oidc}/userinfo")
OIDC_OP_JWKS_ENDPOINT = env_str("GRIDGATE_OIDC_JWKS_ENDPOINT", f"{_oidc}/certs")
OIDC_RP_CLIENT_ID = env_str("GRIDGATE_OIDC_CLIENT_ID", "gridgate")
OIDC_RP_CLIENT_SECRET = env_str("GRIDGATE_OIDC_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = env_str("GRIDGATE_OIDC_SIGN_ALGO", "RS256")
# `groups`: providers that release the groups claim per scope (oidc-provider, Dex, Okta, Authentik)
# send it only when asked; Keycloak ignores a scope it does not know. An absent claim keeps a user's
# groups (apps/accounts/oidc.py).
OIDC_RP_SCOPES = env_str("GRIDGATE_OIDC_SCOPES", "openid email profile groups")
# RP-initiated logout: the provider's end_session_endpoint (its discovery document), to which
# /logout/ sends a browser signed in with it; the ID token is kept in the session as its hint.
GRIDGATE_OIDC_END_SESSION_ENDPOINT = env_str("GRIDGATE_OIDC_END_SESSION_ENDPOINT", f"{_oidc}/logout")
OIDC_STORE_ID_TOKEN = True
# How often the worker confirms with the provider (a refresh grant) that a user who signed in
# there and holds API tokens is still known there; a refusal ends the tokens.
GRIDGATE_OIDC_RECHECK_SECONDS = env_int("GRIDGATE_OIDC_RECHECK_SECONDS", 900, minimum=60)
OIDC_USE_PKCE = True
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("GRIDGATE_OIDC_RENEW_SECONDS", 900, minimum=30)
OIDC_TIMEOUT = 10
OIDC_AUTHENTICATE_CLASS = "apps.accounts.oidc.AuthenticateView"
OIDC_CALLBACK_CLASS = "apps.accounts.oidc.CallbackView"
LOGIN_REDIRECT_URL_FAILURE = "/login/?sso=failed"
# The API, QRMI and the metrics answer JSON to programs: never a redirect to the provider.
OIDC_EXEMPT_URLS = [re.compile(r"^/(api|qrmi)/"), "/metrics"]
# Claims: the username, and the groups (names, or Keycloak's full paths /a/b) that become the
# user's Django groups at each sign-in, so pool grants to groups follow the provider.
GRIDGATE_OIDC_USERNAME_CLAIM = env_str("GRIDGATE_OIDC_USERNAME_CLAIM", "preferred_username")
GRIDGATE_OIDC_GROUPS_CLAIM = env_str("GRIDGATE_OIDC_GROUPS_CLAIM", "groups")
# The provider's public client that terminals sign in with (`gridgate login`: the device
# authorization grant, RFC 8628, where the provider offers it). Unset: the CLI logs in by password.
GRIDGATE_OIDC_CLI_CLIENT_ID = env_str("GRIDGATE_OIDC_CLI_CLIENT_ID", "")
# API bearer tokens: the audience they must name (Keycloak: an audience mapper), and the least
# seconds between two fetches of the provider's keys when a token names a key not seen yet.
# Never the web client's id: that is the audience of its ID tokens (docs/identity.md).
GRIDGATE_OIDC_AUDIENCE = env_str("GRIDGATE_OIDC_AUDIENCE", "gridgate-api")
if GRIDGATE_OIDC_ISSUER and GRIDGATE_OIDC_AUDIENCE == OIDC_RP_CLIENT_ID:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"GRIDGATE_OIDC_AUDIENCE is the web client's id ({OIDC_RP_CLIENT_ID!r}), the audience of its ID tokens: "
        "give the API an audience of its own (e.g. gridgate-api, an audience mapper in Keycloak; docs/identity.md)."
    )
# The JWT header types an API bearer token may have: RFC 9068 access tokens (never an ID token).
GRIDGATE_OIDC_ACCESS_TOKEN_TYPES = [
    kind.lower() for kind in env_list("GRIDGATE_OIDC_ACCESS_TOKEN_TYPES", ["at+jwt", "application/at+jwt"])
]
GRIDGATE_OIDC_JWKS_REFRESH_SECONDS = env_int("GRIDGATE_OIDC_JWKS_REFRESH_SECONDS", 30, minimum=1)

# Per-user remote credentials (docs/backends.md, "Per-user credentials"). The Fernet keys that
# seal the refresh tokens and API tokens users connect, comma-separated: the first seals, every
# one opens, so a key is rotated by putting the new one first and running
# `manage.py reseal_connections` before the old one is dropped. Unset: connecting is refused with
# a message saying so; everything else runs. How long a connect may wait for the provider's answer.
GRIDGATE_CREDENTIALS_KEY = env_list("GRIDGATE_CREDENTIALS_KEY", [])
GRIDGATE_CONNECT_FLOW_SECONDS = env_int("GRIDGATE_CONNECT_FLOW_SECONDS", 600, minimum=30)

# Login throttling with django-axes: the web login, the admin login and the token endpoint.
# Failures are stored in the database, so every web process and host counts the same.
GRIDGATE_LOGIN_FAILURE_LIMIT = env_int("GRIDGATE_LOGIN_FAILURE_LIMIT", 10, minimum=1)
GRIDGATE_LOGIN_COOLOFF_MINUTES = env_int("GRIDGATE_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
# Login attempts a minute from one client address, whatever the usernames (apps/accounts/lockout.py).
GRIDGATE_LOGIN_RATE = env_int("GRIDGATE_LOGIN_RATE", 30, minimum=1)
# The networks of the reverse proxies in front of the web processes, which append the client's
# address to X-Forwarded-For (docs/deployment.md): the header is believed from them only. Without
# it, behind a proxy every client would have the proxy's address.
GRIDGATE_TRUSTED_PROXIES = env_proxy_networks("GRIDGATE_TRUSTED_PROXIES")
AXES_FAILURE_LIMIT = GRIDGATE_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=GRIDGATE_LOGIN_COOLOFF_MINUTES)
# Per username and address together, not either alone: by username anyone could lock a user out
# from everywhere; by address one person's typos would lock out everyone behind the same NAT or
# login node (apps/accounts/lockout.py says more).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "apps.accounts.lockout.client_ip"
AXES_LOCKOUT_CALLABLE = "apps.accounts.lockout.lockout_response"
# A success forgets that username's failures from that address (a person who mistyped nine times
# and then got in starts afresh).
AXES_RESET_ON_SUCCESS = True
# Attempts while locked out are refused without being counted: the lockout ends the cool-off
# after it began, which is what Retry-After tells the client.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("GRIDGATE_STATIC_ROOT", str(VAR_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns at every start while it is missing
# The user pages' stylesheet, script and the vendored htmx (served from here: no CDN, works offline).
STATICFILES_DIRS = [BASE_DIR / "static"]
# Compressed copies (gzip, brotli when installed) made by collectstatic. Not the manifest
# variant: it refuses to render a page whose files were never collected (tests, a fresh clone).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# DEBUG serves straight from the app directories, so an edited file shows without collectstatic.
WHITENOISE_USE_FINDERS = DEBUG

# Content-Security-Policy (django-csp): scripts, styles, fonts and connections from this site only,
# no plugins, no framing, no <base> elsewhere. The pages load their scripts and stylesheet as files
# (htmx, idiomorph, gridgate.js; no inline script, style or handler), htmx is told not to inject its
# indicator <style> nor to eval (templates/web/base.html), charts are server-drawn SVG, and Swagger UI
# runs from its split view (its own script file). An injected <script> or inline handler runs nowhere.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "web:login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Hashed, expiring tokens: `Authorization: Token <key>`, one statement per request.
        "apps.accounts.authentication.ApiTokenAuthentication",
        # The identity provider's JWTs: `Authorization: Bearer <jwt>`, checked against its keys.
        "apps.accounts.oidc.BearerAuthentication",
        # R-QRMI-2: X-Munge-Cred as an alternative to a token (uid linked to the user).
        "apps.qrmi.authentication.MungeAuthentication",
        # The browser's session, refused once a provider sign-in is past its renewal (pages renew it).
        "apps.accounts.authentication.FreshSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON that always encodes (a client's lone surrogate echoed in a 400 is escaped, not a 500).
    "DEFAULT_RENDERER_CLASSES": [
        "apps.core.api.renderers.JSONRenderer",
        "apps.core.api.renderers.BrowsableAPIRenderer",
    ],
    # JSON with a nesting limit (a deep body is a 400, not a RecursionError 500); forms and uploads.
    "DEFAULT_PARSER_CLASSES": [
        "apps.core.api.parsers.DepthLimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "apps.core.api.parsers.NamedFilesMultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "apps.core.api.pagination.StablePageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "apps.core.api.schema.GridgateAutoSchema",
    "EXCEPTION_HANDLER": "apps.core.api.exceptions.exception_handler",
    "COERCE_DECIMAL_TO_STRING": False,
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Gridgate API",
    "DESCRIPTION": "Resource pools, sessions, jobs and cases for shared research compute.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "CaseStatusEnum": "apps.cases.models.CaseStatus",
        "JobStatusEnum": "apps.scheduling.models.JobStatus",
    },
}

# django-q2: the ORM broker needs nothing beyond the database; Redis is an option for larger
# sites (GRIDGATE_REDIS_URL). ``retry`` must exceed ``timeout`` or tasks run twice.
Q_CLUSTER = {
    "name": "gridgate",
    # Event tasks and emulations; the tick loop runs in its own process beside the cluster
    # (manage.py worker starts both, apps.core.ticker).
    "workers": env_int("GRIDGATE_Q_WORKERS", 4, minimum=2),
    "timeout": env_int("GRIDGATE_Q_TIMEOUT", 300, minimum=10),
    "retry": env_int("GRIDGATE_Q_TIMEOUT", 300, minimum=10) + 60,
    "max_attempts": 3,
    "catch_up": False,
    "orm": "default",
    "poll": 0.2,
    "save_limit": 1000,
    "ack_failures": True,
    "label": "Task queue",
}
_redis_url = env_str("GRIDGATE_REDIS_URL")
if _redis_url:
    from urllib.parse import urlparse

    if not urlparse(_redis_url).password and not env_bool("GRIDGATE_REDIS_ALLOW_NO_AUTH", False):
        # A task is a pickle signed with SECRET_KEY; whoever may write to the broker can drop or
        # replay tasks, and with the key run code as the worker (root on case hosts).
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "GRIDGATE_REDIS_URL carries no password: anyone who can reach that Redis could queue tasks "
            "for the workers. Give Redis a password or an ACL user (requirepass / ACL SETUSER) and put it in "
            "the URL (redis://:PASSWORD@host:6379/0 or redis://USER:PASSWORD@host:6379/0), or set "
            "GRIDGATE_REDIS_ALLOW_NO_AUTH=true where no other account or host can reach it (docs/deployment.md)."
        )
    Q_CLUSTER.pop("orm")
    # Bounded waits: redis-py has none by default, so a Redis host that drops packets (rather
    # than refusing) would hold a request's post-commit enqueue for minutes. The URL's own
    # socket_connect_timeout / socket_timeout win; the broker's BLPOP waits 1 s.
    Q_CLUSTER["redis"] = with_query_defaults(_redis_url, socket_connect_timeout="2", socket_timeout="5")

# Gridgate's own settings.
# This worker's host identity: heartbeats, leases and local-backend host affinity. Two processes on
# one machine may claim distinct identities (the scale-out test does).
GRIDGATE_WORKER_HOST = env_str("GRIDGATE_WORKER_HOST", socket.gethostname())[:60]
# One `manage.py worker` per host name at a time (apps.core.worker_host): the lease it renews every
# second; a worker that died leaves it to the next after this many seconds.
GRIDGATE_WORKER_LEASE_SECONDS = env_int("GRIDGATE_WORKER_LEASE_SECONDS", 10, minimum=2)
# Seconds a stopping web or worker process is given to finish what it is doing (gunicorn's
# graceful timeout; `manage.py worker` then kills the cluster). Below systemd's TimeoutStopSec.
GRIDGATE_STOP_GRACE = env_int("GRIDGATE_STOP_GRACE", 30, minimum=1)
GRIDGATE_ALLOW_INSECURE_REMOTES = env_bool("GRIDGATE_ALLOW_INSECURE_REMOTES", False)
# The outbound rules (apps.core.outbound): networks (CIDRs) users' webhooks may reach although they
# are loopback, private or link-local (a site's own receiver on 10.1.2.3/32). Empty: none.
GRIDGATE_OUTBOUND_ALLOWED_NETWORKS = env_list("GRIDGATE_OUTBOUND_ALLOWED_NETWORKS", [])
# Notifications (apps.notifications, docs/operations.md "Notifications"): the delivery pass's
# cadence, a webhook's timeout, attempts before a delivery is given up, the first retry's delay
# (doubled at each attempt, capped at an hour), and how long before a session's end its owner hears.
GRIDGATE_NOTIFY_TICK = env_int("GRIDGATE_NOTIFY_TICK", 5, minimum=1)
GRIDGATE_NOTIFY_TIMEOUT_SECONDS = env_int("GRIDGATE_NOTIFY_TIMEOUT_SECONDS", 5, minimum=1, maximum=60)
GRIDGATE_NOTIFY_MAX_ATTEMPTS = env_int("GRIDGATE_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
GRIDGATE_NOTIFY_RETRY_SECONDS = env_int("GRIDGATE_NOTIFY_RETRY_SECONDS", 30, minimum=1)
GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS = env_int("GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS", 900, minimum=60)
# The most subscriptions one user may hold (each event fans out to all of theirs).
GRIDGATE_NOTIFY_MAX_SUBSCRIPTIONS = env_int("GRIDGATE_NOTIFY_MAX_SUBSCRIPTIONS", 50, minimum=1)
# E-mail (notifications) through Django's mail settings; the console backend prints them instead.
EMAIL_BACKEND = env_str("GRIDGATE_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("GRIDGATE_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("GRIDGATE_EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("GRIDGATE_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("GRIDGATE_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("GRIDGATE_EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("GRIDGATE_EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("GRIDGATE_EMAIL_FROM", "gridgate@localhost")
GRIDGATE_CASES_ROOT = Path(env_str("GRIDGATE_CASES_ROOT", str(VAR_DIR / "cases")))
GRIDGATE_MAX_UPLOAD_MB = env_int("GRIDGATE_MAX_UPLOAD_MB", 512, minimum=1)
# Below this much free space on the cases root's file system a case launch is refused (507), the
# health endpoint reads "degraded" and doctor fails its space check (docs/operations.md).
GRIDGATE_CASES_MIN_FREE_MB = env_int("GRIDGATE_CASES_MIN_FREE_MB", 1024, minimum=0)
# Largest non-file request body (a JSON job payload: a big Pulser sequence); over it: 413 JSON.
# Uploaded files are streamed to disk and limited by GRIDGATE_MAX_UPLOAD_MB instead.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("GRIDGATE_MAX_BODY_MB", 10, minimum=1) * 1024 * 1024
# Each worker's ticker process (manage.py worker) stamps core.WorkerHeartbeat every
# GRIDGATE_WORKER_HEARTBEAT_SECONDS; health reports a worker dead past GRIDGATE_WORKER_STALE_SECONDS.
GRIDGATE_WORKER_HEARTBEAT_SECONDS = env_int("GRIDGATE_WORKER_HEARTBEAT_SECONDS", 5, minimum=1)
GRIDGATE_WORKER_STALE_SECONDS = env_int("GRIDGATE_WORKER_STALE_SECONDS", 30, minimum=3)
# The tick loop (apps.core.ticker): one holder across clusters through a lease of this many
# seconds, renewed every second; another cluster's ticker takes over within it after a death.
GRIDGATE_TICK_LEASE_SECONDS = env_int("GRIDGATE_TICK_LEASE_SECONDS", 5, minimum=2)
# Idempotency-Key on endpoints whose work commits on its own (a case launch): how long a repeat waits
# before it takes over the key of a request that died mid-way (docs/api.md).
GRIDGATE_IDEMPOTENCY_LEASE_SECONDS = env_int("GRIDGATE_IDEMPOTENCY_LEASE_SECONDS", 120, minimum=1)
# manage.py cleanup: how long ended sessions, finished jobs and case events are kept.
GRIDGATE_RETENTION_DAYS = env_int("GRIDGATE_RETENTION_DAYS", 90, minimum=1)
# Run enqueued tasks inline instead of through the broker (tests only).
GRIDGATE_TASKS_EAGER = env_bool("GRIDGATE_TASKS_EAGER", False)
# bench/http_load.py's write floor (SPEC §9): mounts POST /api/v1/bench/write-floor/, which inserts
# a row into a table only that bench creates. Never a deployment setting: it is no feature.
GRIDGATE_BENCH_WRITE_FLOOR = env_bool("GRIDGATE_BENCH_WRITE_FLOOR", False)
# Scheduler cadences (seconds): the ticker's period and how often a running job is polled.
GRIDGATE_DISPATCH_TICK = env_int("GRIDGATE_DISPATCH_TICK", 1, minimum=1)
GRIDGATE_JOB_POLL_INTERVAL = env_int("GRIDGATE_JOB_POLL_INTERVAL", 2, minimum=1)
# How long a worker's claim on a job (its hand-over to the device, or one poll) lasts without
# renewal: a worker that dies mid-call leaves the job to the others after this. A live worker
# renews it every quarter while a provider call runs, however long the call.
GRIDGATE_JOB_LEASE_SECONDS = env_int("GRIDGATE_JOB_LEASE_SECONDS", 30, minimum=2)
# A job's expected device time before its device has completed any in its shots band (R-JOB-5):
# the ETA of pending jobs and usage_fair's in-flight estimate start from it.
GRIDGATE_JOB_SECONDS_GUESS = env_int("GRIDGATE_JOB_SECONDS_GUESS", 60, minimum=1)
# How often the worker asks a real QPU's provider (pasqal_qpu, pasqal_cloud) whether it is up.
GRIDGATE_DEVICE_STATUS_INTERVAL = env_int("GRIDGATE_DEVICE_STATUS_INTERVAL", 15, minimum=1)
# Emulator runs (apps.scheduling.drivers.emulator, docs/operations.md "Recovery"): a running
# simulation stamps its heartbeat every HEARTBEAT seconds; past DEAD_AFTER without one its worker is
# dead and the run is re-run, at most MAX_ATTEMPTS starts in all (then failed: a poison pill). A
# queued run no worker started within REQUEUE seconds (its task was lost) is enqueued again.
GRIDGATE_EMULATOR_HEARTBEAT_SECONDS = env_int("GRIDGATE_EMULATOR_HEARTBEAT_SECONDS", 5, minimum=1)
GRIDGATE_EMULATOR_DEAD_AFTER = env_int("GRIDGATE_EMULATOR_DEAD_AFTER", 30, minimum=2)
if GRIDGATE_EMULATOR_DEAD_AFTER < 2 * GRIDGATE_EMULATOR_HEARTBEAT_SECONDS:
    # One late or missed beat (a busy database, a worker reconnecting after an outage) must not
    # get a live run re-run.
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"GRIDGATE_EMULATOR_DEAD_AFTER ({GRIDGATE_EMULATOR_DEAD_AFTER} s) must be at least twice "
        f"GRIDGATE_EMULATOR_HEARTBEAT_SECONDS ({GRIDGATE_EMULATOR_HEARTBEAT_SECONDS} s): a live run missing one "
        "beat would be taken for dead and run again."
    )
GRIDGATE_EMULATOR_MAX_ATTEMPTS = env_int("GRIDGATE_EMULATOR_MAX_ATTEMPTS", 3, minimum=1)
GRIDGATE_EMULATOR_REQUEUE_SECONDS = env_int("GRIDGATE_EMULATOR_REQUEUE_SECONDS", 10, minimum=1)

# Cases and execution backends (SPEC §6; cadences in docs/operations.md).
# Pool kind → backend name, e.g. GRIDGATE_CASE_BACKENDS="local=local,slurm=slurm" (a kind left out
# runs no cases); unset: every pool kind to the backend of its name (apps.backends.registry).
GRIDGATE_CASE_BACKENDS = env_mapping("GRIDGATE_CASE_BACKENDS")
GRIDGATE_CASE_POLL_SECONDS = env_int("GRIDGATE_CASE_POLL_SECONDS", 10, minimum=1)
GRIDGATE_CASE_SYNC_SECONDS = env_int("GRIDGATE_CASE_SYNC_SECONDS", 60, minimum=1)
GRIDGATE_CASE_MAX_BACKOFF_SECONDS = env_int("GRIDGATE_CASE_MAX_BACKOFF_SECONDS", 600, minimum=1)
GRIDGATE_CASE_LEASE_SECONDS = env_int("GRIDGATE_CASE_LEASE_SECONDS", 120, minimum=10)
# At most 10 000: a pass names its cases in statements' IN lists, a parameter each (PostgreSQL
# takes 65 535 per statement with server-side binding).
GRIDGATE_CASE_PASS_BATCH = env_int("GRIDGATE_CASE_PASS_BATCH", 1000, minimum=1, maximum=10_000)
GRIDGATE_CASE_REFRESH_SECONDS = env_int("GRIDGATE_CASE_REFRESH_SECONDS", 5, minimum=0)
GRIDGATE_CASE_TICK_INTERVAL = env_int("GRIDGATE_CASE_TICK_INTERVAL", 5, minimum=1)
# R-CASE-8: the unprivileged account unlinked users' cases run as on pools that allow it, and how
# long a cancelled local case gets between SIGTERM and SIGKILL (docs/operations.md).
GRIDGATE_SANDBOX_USER = env_str("GRIDGATE_SANDBOX_USER", "gridgate-sandbox")
GRIDGATE_CASE_CANCEL_GRACE_SECONDS = env_int("GRIDGATE_CASE_CANCEL_GRACE_SECONDS", 10, minimum=0)
# A local case's bounds (docs/operations.md "Bounds"): the cgroup hierarchy its cgroup is made in,
# relative to the cgroup mount ("off": no cgroup, no memory/task/CPU bound); how much of each log
# is kept; the processes one account may run at once across its cases on a host (RLIMIT_NPROC,
# above any class's max_tasks); how often the disk bound is measured.
GRIDGATE_CASE_CGROUP = env_str("GRIDGATE_CASE_CGROUP", "gridgate").strip("/")
if GRIDGATE_CASE_CGROUP != "off" and (
    not GRIDGATE_CASE_CGROUP
    or ".." in GRIDGATE_CASE_CGROUP.split("/")
    or not all(c.isalnum() or c in "_.-/@" for c in GRIDGATE_CASE_CGROUP)
):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"GRIDGATE_CASE_CGROUP={GRIDGATE_CASE_CGROUP!r}: a path below the cgroup mount (letters, digits, "
        "'_.-@/', no '..'), or 'off'."
    )
GRIDGATE_CASE_MAX_LOG_MB = env_int("GRIDGATE_CASE_MAX_LOG_MB", 64, minimum=1)
GRIDGATE_CASE_NPROC = env_int("GRIDGATE_CASE_NPROC", 4096, minimum=16)
GRIDGATE_CASE_DISK_CHECK_SECONDS = env_int("GRIDGATE_CASE_DISK_CHECK_SECONDS", 5, minimum=1)
# What only root may do (the account switch, another account's files) goes through the
# privileged helper (apps/backends/privileged.py). On a site whose web and worker run as the
# service's own account: the sudo rule that runs its root-owned copy (docs/deployment.md), e.g.
# "sudo -n /usr/bin/python3 -I -S /usr/local/libexec/gridgate-privileged". Unset: this checkout's
# copy, run directly (a service that runs as root, or trusted pools that run as the service).
GRIDGATE_PRIVILEGED_COMMAND = env_str("GRIDGATE_PRIVILEGED_COMMAND", "")
# The lowest uid a case may run as (the sandbox account excepted): never a system account such as
# postgres or www-data, whatever an account link says. Under sudo the helper's own file decides.
GRIDGATE_CASE_MIN_UID = env_int("GRIDGATE_CASE_MIN_UID", 1000, minimum=1)
GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = env_int("GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS", 600, minimum=0)

# QRMI / MUNGE (SPEC §7b, docs/qrmi.md). Uids whose MUNGE credentials act for other users on
# acquire/release (the SPANK plugin runs as root); libmunge; munged's socket ("" = default).
GRIDGATE_MUNGE_SERVICE_UIDS = frozenset(env_int_list("GRIDGATE_MUNGE_SERVICE_UIDS", [0]))
GRIDGATE_MUNGE_LIBRARY = env_str("GRIDGATE_MUNGE_LIBRARY", "libmunge.so.2")
GRIDGATE_MUNGE_SOCKET = env_str("GRIDGATE_MUNGE_SOCKET", "")

# Slurm licences kept equal to QPU pools' free slots (docs/qrmi.md, "Slurm licences"): the clusters
# a licence is made for (empty: the cluster of the worker's own slurm.conf), the slurm.conf the
# worker's sacctmgr reads (empty: Slurm's default or SLURM_CONF), the reconcile pass's period.
GRIDGATE_LICENCE_CLUSTERS = env_list("GRIDGATE_LICENCE_CLUSTERS", [])
GRIDGATE_LICENCE_SLURM_CONF = env_str("GRIDGATE_LICENCE_SLURM_CONF", "")
GRIDGATE_LICENCE_RECONCILE_SECONDS = env_int("GRIDGATE_LICENCE_RECONCILE_SECONDS", 60, minimum=5)
GRIDGATE_LICENCE_SACCTMGR_TIMEOUT = env_int("GRIDGATE_LICENCE_SACCTMGR_TIMEOUT", 30, minimum=1)

# /metrics (docs/metrics.md): a bearer token and/or the client networks allowed to scrape. With
# neither set the endpoint answers 404: it is never open by default. With both, both apply.
GRIDGATE_METRICS_TOKEN = env_str("GRIDGATE_METRICS_TOKEN", "") or ""
if GRIDGATE_METRICS_TOKEN and len(GRIDGATE_METRICS_TOKEN) < 16:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("GRIDGATE_METRICS_TOKEN is shorter than 16 characters: use a long random value.")
GRIDGATE_METRICS_NETWORKS = env_networks("GRIDGATE_METRICS_NETWORKS")
# Load sensors and schedulers that read private pools' status without a login (a pool's
# `accessible`, QRMI's `qpu-slots`): their networks. Anyone else sees only public pools' and their
# own pools' status (apps.resources.selectors.may_read_status).
GRIDGATE_LOAD_SENSOR_NETWORKS = env_networks("GRIDGATE_LOAD_SENSOR_NETWORKS")

# Any case (``warning``, ``WARNING``): Python's logging knows the names only in upper case, and a
# lower-case value used to stop every process at start with a bare "Unknown level" ValueError.
GRIDGATE_LOG_LEVEL = env_choice("GRIDGATE_LOG_LEVEL", "info", ["debug", "info", "warning", "error", "critical"]).upper()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # One record, one line: a line break in a logged value is written as an escape (apps/core/logs.py).
    "formatters": {
        "plain": {"()": "apps.core.logs.OneLineFormatter", "format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": GRIDGATE_LOG_LEVEL},
    "loggers": {
        # Django's own handlers (a console one under DEBUG, mail to ADMINS, which Gridgate leaves
        # empty) would write its records a second time, not as one line: they reach the root's.
        "django": {"handlers": []},
        "django.db.backends": {"level": "WARNING"},
        # django-axes: its failed logins and lockouts (warnings), not its start-up banner at every
        # command nor its lines about each successful login and clean-up.
        "axes": {"level": "WARNING"},
    },
}
