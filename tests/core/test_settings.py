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


def test_process_start_fails_with_the_variable_name(tmp_path):
    env = dict(os.environ, DATABASE_URL="nonsense://", GRIDGATE_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr
