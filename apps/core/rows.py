"""Model instances from the rows of hand-written statements (STYLE.md rule 4).

A statement written by hand for a measured reason (issue 15: session admission) selects the
concrete columns of one or more models side by side; ``Columns`` names them in order and turns its
part of a row back into an instance through the converters the ORM itself applies (JSON
decoding, SQLite's decimals and datetimes), so callers get ordinary model objects.
"""

import functools

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import signals
from django.db.models.sql import Query


class Columns:
    """The concrete columns of ``model``, qualified by ``alias``, in field order."""

    def __init__(self, model, alias: str):
        self.model, self.alias = model, alias
        self.fields = list(model._meta.concrete_fields)
        self.sql = ", ".join(f'{alias}."{field.column}"' for field in self.fields)
        self._converters = {}  # by database vendor: {position: (functions, expression)}

    def __len__(self):
        return len(self.fields)

    def instance(self, values):
        """The instance of ``values`` (this model's part of a row, in ``self.fields`` order)."""
        connection = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: see prepared()
        converters = self._converters.get(connection.vendor)
        if converters is None:  # the compiler's own lookup, once per backend
            compiler = Query(self.model).get_compiler(connection=connection)
            table = self.model._meta.db_table
            converters = compiler.get_converters([field.get_col(table) for field in self.fields])
            self._converters[connection.vendor] = converters
        values = list(values)
        for position, (functions, expression) in converters.items():
            for function in functions:
                values[position] = function(values[position], expression, connection)
        return self.model.from_db(connection.alias, [field.attname for field in self.fields], values)


def fetch_one(sql: str, params, *parts: Columns) -> tuple | None:
    """The first row of ``sql``, split by :func:`split`; None when there is no row."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else split(row, parts)


def split(row, parts) -> tuple:
    """``row`` as one instance per ``Columns`` of ``parts`` (selected in that order, first in the
    row) followed by the row's remaining values. A part whose primary key is NULL (a LEFT JOIN
    that matched nothing) is None."""
    found, start = [], 0
    for part in parts:
        values = row[start : start + len(part)]
        pk_at = part.fields.index(part.model._meta.pk)
        found.append(None if values[pk_at] is None else part.instance(values))
        start += len(part)
    return (*found, *row[start:])


def prepared(instance, fields) -> list:
    """``fields``' values of ``instance`` as ``save()`` sends them (``pre_save``, then
    ``get_db_prep_save``): JSON adapted, datetimes and UUIDs in the backend's form."""
    # The connection wrapper itself, not django.db.connection: each attribute read through that
    # proxy looks the wrapper up again in asgiref's thread-and-task local, and the fields read it
    # several times each; a submission's 25 columns spent ~0.05 ms of web CPU on it (of ~1.85).
    db = connections[DEFAULT_DB_ALIAS]
    return [field.get_db_prep_save(field.pre_save(instance, True), db) for field in fields]


def insert(instance) -> None:
    """INSERT ``instance`` as ``save(force_insert=True)`` stores it, without the ORM building the
    statement (~0.4 ms of CPU, a tenth of an acquire: issue 15). For models whose primary key is
    set in Python (a UUID default); a model with save signals' receivers goes through
    ``save()`` so that none is skipped."""
    statement = insert_statement(instance)
    if statement is None:
        instance.save(force_insert=True)
        return
    with connection.cursor() as cursor:
        cursor.execute(*statement)
    inserted(instance)


def insert_statement(instance, *, select: tuple[str, list] | None = None) -> tuple[str, list] | None:
    """The ``(sql, params)`` of :func:`insert`, for a caller that sends it within another
    statement (then calls :func:`inserted`); None when the model has save signals' receivers
    (the caller must ``save()``).

    ``select``: ``(" FROM … WHERE …", params)`` to insert the row only where that finds one
    (``INSERT … SELECT <the values> FROM … WHERE …``), as admission inserts a session only if
    it fits."""
    model = type(instance)
    if signals.pre_save.has_listeners(model) or signals.post_save.has_listeners(model):
        return None
    fields = list(model._meta.concrete_fields)
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    marks = ", ".join(["%s"] * len(fields))
    values = prepared(instance, fields)
    if select is not None:
        sql = f"INSERT INTO {model._meta.db_table} ({columns}) SELECT {marks}{select[0]}"  # noqa: S608 (names from _meta)
        return sql, [*values, *select[1]]
    sql = f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({marks})"  # noqa: S608 (names from _meta)
    return sql, values


def inserted(instance) -> None:
    """Mark ``instance`` as stored, as ``save()`` does."""
    instance._state.adding, instance._state.db = False, connection.alias


def pipelining() -> bool:
    """Whether :func:`in_one_round_trip` can run here: PostgreSQL through a libpq with pipeline
    mode (14 and later; psycopg's binary wheel bundles one)."""
    return connection.vendor == "postgresql" and _libpq_pipelines()


@functools.cache
def _libpq_pipelines() -> bool:
    import psycopg

    return psycopg.Pipeline.is_supported()


def in_one_round_trip(statements: list[tuple[str, list]]) -> list[list[tuple]]:
    """Run ``statements`` as one transaction sent to PostgreSQL at once (libpq's pipeline mode:
    BEGIN, the statements, COMMIT, then one wait for all their results); return each one's rows.

    Why (issue 15, measured with bench/http_load.py): admission holds its pool's row lock from
    the statement that takes it until COMMIT. Sent one by one, that lock stayed held while the
    server thread waited for a CPU and its process's GIL between statements, so concurrent
    acquires on one pool queued behind a Python thread rather than behind the database: sampled
    under 8 clients, about two connections waited on the lock and one more sat "idle in
    transaction" holding it. Sent at once, the lock is held for the database's own work only:
    REST acquire+release went from 0.42-0.46 to 0.46-0.50 of the floor per request in
    interleaved runs.

    Each statement runs after the one before it has finished, in its own snapshot, as sent one
    by one; one that returns no rows (an UPDATE without RETURNING) gives ``[]``. An error stops
    the rest, the transaction is rolled back (the connection closed if it cannot be), and it is
    raised as Django raises it (``IntegrityError`` …). Inside a caller's transaction (``atomic``) the statements
    run in a savepoint of it instead, released or rolled back the same way, and commit with it.
    """
    import psycopg
    from psycopg.pq import TransactionStatus

    outer = connection.in_atomic_block
    begin, end, undo = (
        ("SAVEPOINT one_round_trip", "RELEASE SAVEPOINT one_round_trip", "ROLLBACK TO SAVEPOINT one_round_trip")
        if outer
        else ("BEGIN", "COMMIT", "ROLLBACK")
    )
    # Cursors are made first: the first cursor of a request may run the connection's health check.
    control, *cursors = (connection.cursor() for _ in range(len(statements) + 1))
    raw = connection.connection
    try:
        with connection.wrap_database_errors:
            try:
                with raw.pipeline():
                    control.execute(begin)
                    for cursor, (sql, params) in zip(cursors, statements, strict=True):
                        cursor.execute(sql, params)
                    control.execute(end)
            except BaseException:
                # Whatever stopped it (an error of a statement, a timeout between two executes),
                # nothing of it may stay open for the connection's next request.
                status = raw.info.transaction_status
                try:
                    if status == TransactionStatus.INERROR or (not outer and status != TransactionStatus.IDLE):
                        raw.execute(undo)
                        if outer:
                            raw.execute(end)
                except psycopg.Error:
                    connection.close()
                raise
        return [cursor.fetchall() if cursor.description is not None else [] for cursor in cursors]
    finally:
        for cursor in (control, *cursors):
            cursor.close()
