"""Run a command with DATABASE_URL pointing at the test database.

- DATABASE_URL already set: used as is.
- PostgreSQL answering on 127.0.0.1:5432 (or GRIDGATE_TEST_PG): use it; the concurrency tests run.
- Otherwise, outside CI: SQLite, and PostgreSQL-only tests are skipped with the reason printed.
- Under CI (CI=true) PostgreSQL is required: fail rather than skip the concurrency tests.
"""

import os
import sys

PG_URL = os.environ.get("GRIDGATE_TEST_PG", "postgres://postgres@127.0.0.1:5432/gridgate")


def postgres_ready(url: str) -> tuple[bool, str]:
    try:
        import psycopg
    except ImportError as exc:
        return False, f"psycopg is not installed ({exc})"
    server = url.rsplit("/", 1)[0] + "/postgres"
    dbname = url.rsplit("/", 1)[1]
    try:
        with psycopg.connect(server, connect_timeout=3, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{dbname}"')
        return True, ""
    except Exception as exc:
        return False, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: with_test_database.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    env = dict(os.environ)
    ci = env.get("CI", "").lower() == "true"
    if not env.get("DATABASE_URL"):
        ok, reason = postgres_ready(PG_URL)
        if ok:
            env["DATABASE_URL"] = PG_URL
            print(f"test database: PostgreSQL ({PG_URL})", file=sys.stderr)
        elif ci:
            print(f"CI=true and PostgreSQL is not reachable at {PG_URL}: {reason}", file=sys.stderr)
            return 3
        else:
            env["DATABASE_URL"] = "sqlite:///var/test.sqlite3"
            env["GRIDGATE_TEST_PG_SKIP_REASON"] = f"PostgreSQL not reachable at {PG_URL}: {reason}"
            print(
                f"test database: SQLite (PostgreSQL not reachable: {reason}); PostgreSQL-only tests will be skipped",
                file=sys.stderr,
            )
    os.makedirs("var", exist_ok=True)
    os.execvpe(sys.argv[1], sys.argv[1:], env)  # noqa: S606 - replaces this process by design


if __name__ == "__main__":
    sys.exit(main())
