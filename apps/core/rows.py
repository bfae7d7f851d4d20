"""Model instances from the rows of hand-written statements (STYLE.md rule 4).

A statement written by hand for a measured reason (admission, job submission) selects the
concrete columns of one or more models side by side; ``Columns`` names them in order and turns its
part of a row back into an instance through the converters the ORM itself applies (JSON
decoding, SQLite's decimals and datetimes), so callers get ordinary model objects. The other
way round, ``insert_values`` gives a hand-written INSERT its columns and values, and
``bulk_write`` writes fields of many rows back in one ``UPDATE … FROM (VALUES …)``.
"""

from django.db import connection
from django.db.models.fields import AutoFieldMixin
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


def insert_values(instance, exclude=()) -> tuple[str, list]:
    """The quoted column list of ``instance``'s model and the values ``save(force_insert=True)``
    would send for them (``pre_save``, then ``get_db_prep_save``: JSON adapted, datetimes and
    UUIDs in the backend's form), for a hand-written INSERT. Like ``bulk_create``, such an
    INSERT sends no save signal; the models inserted this way have no receiver.
    ``instance``'s primary key must be set (a UUID default), or left out by the caller's model
    (an AutoField: its column is not listed). ``exclude``: attribute names the caller's INSERT
    takes from elsewhere (listed last, by the caller)."""
    fields = [
        field
        for field in instance._meta.concrete_fields
        if not isinstance(field, AutoFieldMixin) and field.attname not in exclude
    ]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    return columns, [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]


def bulk_write(instances: list, fields: list[str]) -> None:
    """Write ``fields`` of ``instances`` (saved rows of one model) back in one UPDATE per
    statement's worth of rows, sending no save signal (like ``bulk_update``).

    On PostgreSQL ``UPDATE t SET f = CAST(v.f AS type), … FROM (VALUES (pk, f, …), …) AS v
    WHERE t.pk = CAST(v.pk AS type)``: Django's ``bulk_update`` builds a ``CASE WHEN`` per field
    and row instead, which made the write-back most of a 1 000-case poll pass. A statement takes
    at most the backend's parameter limit (65 535 on PostgreSQL; a value per field and row, plus
    the key), so a larger batch is written in several. Elsewhere (SQLite) ``bulk_update``."""
    if not instances:
        return
    model = type(instances[0])
    if connection.vendor != "postgresql":
        model._base_manager.bulk_update(instances, fields)
        return
    per_statement = connection.features.max_query_params // (len(fields) + 1)
    for start in range(0, len(instances), per_statement):
        _update_from_values(model, instances[start : start + per_statement], fields)


def _update_from_values(model, instances: list, fields: list[str]) -> None:
    quote = connection.ops.quote_name
    pk = model._meta.pk
    model_fields = [model._meta.get_field(name) for name in fields]
    table = quote(model._meta.db_table)
    sets = ", ".join(
        f"{quote(field.column)} = CAST(v.c{i} AS {field.db_type(connection)})" for i, field in enumerate(model_fields)
    )
    names = ", ".join(["pk"] + [f"c{i}" for i in range(len(fields))])
    row = "(" + ", ".join(["%s"] * (len(fields) + 1)) + ")"
    params = []
    for instance in instances:
        params.append(pk.get_db_prep_save(instance.pk, connection))
        params += [field.get_db_prep_save(getattr(instance, field.attname), connection) for field in model_fields]
    # Only model metadata (quoted names, column types) is interpolated; every value is a parameter.
    values = ", ".join([row] * len(instances))
    sql = (
        f"UPDATE {table} SET {sets} FROM (VALUES {values}) AS v({names}) "  # noqa: S608
        f"WHERE {table}.{quote(pk.column)} = CAST(v.pk AS {pk.db_type(connection)})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
