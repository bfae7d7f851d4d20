"""Django's PostgreSQL backend, with batches bounded by the protocol's parameter limit.

With server-side binding (``DATABASE_PREPARE_THRESHOLD``, config/env.py) every value is a
parameter of the statement, and PostgreSQL takes at most 65 535 of them. Django's PostgreSQL
backend knows no such limit (with client-side binding there is none), so a deletion that cascades
to more rows in one ``IN`` list, or a bulk create or update of more values, failed:
``manage.py cleanup`` of 70 000 ended sessions stopped there, every day. Declaring the limit makes
Django batch those statements, as it does for SQLite and Oracle.
"""

from django.db.backends.postgresql import base, features, operations


class DatabaseFeatures(features.DatabaseFeatures):
    max_query_params = 2**16 - 1


class DatabaseOperations(operations.DatabaseOperations):
    def bulk_batch_size(self, fields, objs):
        if fields:
            return self.connection.features.max_query_params // len(fields)
        return len(objs)


class DatabaseWrapper(base.DatabaseWrapper):
    features_class = DatabaseFeatures
    ops_class = DatabaseOperations
