"""Settings from the environment: a malformed value stops the process naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_database, env_int

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, value, reader",
    [
        ("DEBUG", "maybe", lambda: env_bool("DEBUG")),
        ("GRIDGATE_MAX_UPLOAD_MB", "lots", lambda: env_int("GRIDGATE_MAX_UPLOAD_MB", 1)),
        ("GRIDGATE_CASE_PASS_BATCH", "70000", lambda: env_int("GRIDGATE_CASE_PASS_BATCH", 1, maximum=10_000)),
        ("DATABASE_URL", "mysql://x@y/z", lambda: env_database("DATABASE_URL", Path("/tmp/x.db"))),
        ("DATABASE_URL", "postgres://host:notaport/db", lambda: env_database("DATABASE_URL", Path("/tmp/x"))),
    ],
)
def test_bad_value_names_the_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=name):
        reader()


def test_embedded_sqlite_uses_immediate_transactions(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    config = env_database("DATABASE_URL", tmp_path / "db.sqlite3")
    assert config["ENGINE"] == "django.db.backends.sqlite3"
    assert config["OPTIONS"]["transaction_mode"] == "IMMEDIATE"


def test_the_embedded_sqlite_file_is_created_readable_by_its_owner_only(tmp_path):
    """F13: SQLite created the file with the umask's mode (0644): password hashes, sessions and
    token digests readable by every account on the host. Now 0600 from its creation, and an
    older file of the service's left open to others is closed."""
    script = (
        "import os; os.umask(0o022); import django; django.setup(); from django.db import connection; "
        "connection.cursor().execute('create table if not exists probe (x integer)')"
    )
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", "GRIDGATE_VAR_DIR": str(tmp_path), "DATABASE_URL": ""}
    assert _run(["-c", script], **env).returncode == 0
    database = tmp_path / "gridgate.sqlite3"
    assert database.stat().st_mode & 0o777 == 0o600
    database.chmod(0o644)  # made by an earlier version
    assert _run(["-c", script], **env).returncode == 0
    assert database.stat().st_mode & 0o777 == 0o600


def test_process_start_fails_with_the_variable_name(tmp_path):
    env = dict(os.environ, DATABASE_URL="nonsense://", GRIDGATE_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr


def _run(args, **env):
    # The test process's own switches (DEBUG, the browser tests' DJANGO_ALLOW_ASYNC_UNSAFE) are
    # not part of the documented production environment.
    dropped = {"DEBUG", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    full = {k: v for k, v in os.environ.items() if k not in dropped}
    full.update(env)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)


def test_web_app_refuses_to_start_with_debug_off_and_no_allowed_hosts(tmp_path):
    """A start-up message instead of 400 to every request."""
    result = _run(["-c", "import config.wsgi"], DEBUG="false", GRIDGATE_VAR_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "ALLOWED_HOSTS is empty and DEBUG is off" in result.stderr


def test_web_app_starts_with_allowed_hosts(tmp_path):
    hosts = "gridgate.example.org"
    result = _run(["-c", "import config.wsgi"], DEBUG="false", ALLOWED_HOSTS=hosts, GRIDGATE_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr


def test_check_deploy_is_clean_with_the_documented_variables(tmp_path):
    """docs/deployment.md's production variables satisfy every `check --deploy` warning."""
    result = _run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        DEBUG="false",
        ALLOWED_HOSTS="gridgate.example.org",
        CSRF_TRUSTED_ORIGINS="https://gridgate.example.org",
        SECRET_KEY="x" * 20 + "-a-long-random-production-key-9f8e7d6c5b4a",
        GRIDGATE_HTTPS="true",
        GRIDGATE_TRUST_X_FORWARDED_PROTO="true",
        GRIDGATE_HSTS_INCLUDE_SUBDOMAINS="true",
        GRIDGATE_HSTS_PRELOAD="true",
        GRIDGATE_VAR_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_https_settings_follow_gridgate_https(monkeypatch):
    result = _run(
        [
            "-c",
            "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); django.setup();"
            "from django.conf import settings as s;"
            "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS,"
            " s.SECURE_PROXY_SSL_HEADER)",
        ],
        GRIDGATE_HTTPS="true",
        GRIDGATE_TRUST_X_FORWARDED_PROTO="true",
    )
    assert result.stdout.split() == ["True", "True", "True", "31536000", "('HTTP_X_FORWARDED_PROTO',", "'https')"]


def test_persistent_connections_come_from_the_environment(monkeypatch):
    """CONN_MAX_AGE / CONN_HEALTH_CHECKS: persistent by default, without the per-request ping (a
    database restart is a 503, tests/core/test_database_restart.py)."""
    monkeypatch.delenv("CONN_MAX_AGE", raising=False)
    monkeypatch.delenv("CONN_HEALTH_CHECKS", raising=False)
    config = env_database("DATABASE_URL_UNSET_FOR_TEST", Path("/tmp/x.sqlite3"))
    assert config["CONN_MAX_AGE"] == 600 and config["CONN_HEALTH_CHECKS"] is False
    monkeypatch.setenv("CONN_MAX_AGE", "0")
    monkeypatch.setenv("CONN_HEALTH_CHECKS", "true")
    config = env_database("DATABASE_URL_UNSET_FOR_TEST", Path("/tmp/x.sqlite3"))
    assert config["CONN_MAX_AGE"] == 0 and config["CONN_HEALTH_CHECKS"] is True


def test_postgres_statements_are_prepared_by_default_and_can_be_turned_off(monkeypatch):
    """Server-side binding with psycopg's prepare threshold (5 by default); "off" keeps Django's
    client-side binding (PgBouncer in transaction mode without prepared statements); SQLite has
    neither."""
    monkeypatch.setenv("GRIDGATE_TEST_DB_URL", "postgres://gridgate@db.example:5432/gridgate")
    monkeypatch.delenv("DATABASE_PREPARE_THRESHOLD", raising=False)
    config = env_database("GRIDGATE_TEST_DB_URL", Path("/tmp/x.sqlite3"))
    assert config["ENGINE"] == "config.postgresql"  # with batches within the parameter limit
    options = config["OPTIONS"]
    assert options["server_side_binding"] is True and options["prepare_threshold"] == 5
    monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", "0")
    assert env_database("GRIDGATE_TEST_DB_URL", Path("/tmp/x.sqlite3"))["OPTIONS"]["prepare_threshold"] == 0
    monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", "off")
    options = env_database("GRIDGATE_TEST_DB_URL", Path("/tmp/x.sqlite3"))["OPTIONS"]
    assert "server_side_binding" not in options and "prepare_threshold" not in options
    monkeypatch.setenv("DATABASE_PREPARE_THRESHOLD", "soon")
    with pytest.raises(ImproperlyConfigured, match="DATABASE_PREPARE_THRESHOLD"):
        env_database("GRIDGATE_TEST_DB_URL", Path("/tmp/x.sqlite3"))
    monkeypatch.delenv("DATABASE_PREPARE_THRESHOLD")
    sqlite = env_database("DATABASE_URL_UNSET_FOR_TEST", Path("/tmp/x.sqlite3"))["OPTIONS"]
    assert "server_side_binding" not in sqlite and "prepare_threshold" not in sqlite


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_statement_repeated_on_a_connection_is_prepared_on_the_server():
    """What the settings ask for takes effect: after the threshold, PostgreSQL holds the statement
    prepared (it is executed, not parsed and planned again), through the ORM."""
    import uuid

    from django.db import connection

    from apps.sessions.models import Session

    threshold = connection.settings_dict["OPTIONS"].get("prepare_threshold", 5)
    for _ in range(threshold + 1):
        Session.objects.filter(pk=uuid.uuid4()).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('FROM "compute_sessions_session"' in text for text in prepared), prepared


def test_emulator_dead_after_below_twice_the_heartbeat_is_refused_at_start_naming_both(tmp_path):
    """One late beat must not get a live emulation re-run."""
    load = ["-c", "import config.settings"]
    refused = _run(
        load,
        GRIDGATE_VAR_DIR=str(tmp_path),
        GRIDGATE_EMULATOR_DEAD_AFTER="9",
        GRIDGATE_EMULATOR_HEARTBEAT_SECONDS="5",
    )
    assert refused.returncode != 0
    assert "ImproperlyConfigured" in refused.stderr
    assert "GRIDGATE_EMULATOR_DEAD_AFTER" in refused.stderr and "GRIDGATE_EMULATOR_HEARTBEAT_SECONDS" in refused.stderr
    accepted = _run(
        load,
        GRIDGATE_VAR_DIR=str(tmp_path),
        GRIDGATE_EMULATOR_DEAD_AFTER="10",
        GRIDGATE_EMULATOR_HEARTBEAT_SECONDS="5",
    )
    assert accepted.returncode == 0, accepted.stderr


def test_a_redis_broker_without_a_password_is_refused_at_start(tmp_path):
    """A writer to the broker queues tasks for the workers; the URL must carry credentials unless
    the operator says nobody else can reach that Redis."""
    load = ["-c", "import config.settings"]
    refused = _run(load, GRIDGATE_VAR_DIR=str(tmp_path), GRIDGATE_REDIS_URL="redis://127.0.0.1:6379/0")
    assert refused.returncode != 0 and "GRIDGATE_REDIS_ALLOW_NO_AUTH" in refused.stderr
    for extra in (
        {"GRIDGATE_REDIS_URL": "redis://:pw-4711@127.0.0.1:6379/0"},
        {"GRIDGATE_REDIS_URL": "redis://gridgate:pw-4711@127.0.0.1:6379/0"},
        {"GRIDGATE_REDIS_URL": "redis://127.0.0.1:6379/0", "GRIDGATE_REDIS_ALLOW_NO_AUTH": "true"},
    ):
        accepted = _run(load, GRIDGATE_VAR_DIR=str(tmp_path), **extra)
        assert accepted.returncode == 0, accepted.stderr
        assert "pw-4711" not in accepted.stderr


def test_a_case_pass_batch_beyond_what_a_statement_can_name_is_refused_at_start(tmp_path):
    """A pass names its cases in IN lists, a parameter each (PostgreSQL takes 65 535 per statement
    with server-side binding): refused at start, not in every pass."""
    refused = _run(["-c", "import config.settings"], GRIDGATE_VAR_DIR=str(tmp_path), GRIDGATE_CASE_PASS_BATCH="70000")
    assert refused.returncode != 0 and "GRIDGATE_CASE_PASS_BATCH" in refused.stderr
    accepted = _run(["-c", "import config.settings"], GRIDGATE_VAR_DIR=str(tmp_path), GRIDGATE_CASE_PASS_BATCH="10000")
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize("level", ["warning", "WARNING", "Error", "debug"])
def test_a_log_level_in_any_case_starts(tmp_path, level):
    """`GRIDGATE_LOG_LEVEL=warning` (as operators write it, and as gunicorn takes it) stopped every
    process at start: Python's logging knows the names only in upper case."""
    started = _run(["manage.py", "check"], GRIDGATE_VAR_DIR=str(tmp_path), GRIDGATE_LOG_LEVEL=level)
    assert started.returncode == 0, started.stderr


def test_an_unknown_log_level_is_refused_at_start_naming_the_variable(tmp_path):
    refused = _run(["manage.py", "check"], GRIDGATE_VAR_DIR=str(tmp_path), GRIDGATE_LOG_LEVEL="loud")
    assert refused.returncode != 0 and "GRIDGATE_LOG_LEVEL" in refused.stderr
