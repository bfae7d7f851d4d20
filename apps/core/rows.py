"""Model instances from the rows of hand-written statements (STYLE.md rule 4).

A statement written by hand for a measured reason (issue 15: session admission) selects the
concrete columns of one or more models side by side; ``Columns`` names them in order and turns its
part of a row back into an instance through the converters the ORM itself applies (JSON
decoding, SQLite's decimals and datetimes), so callers get ordinary model objects.
"""

from django.db import connection
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
