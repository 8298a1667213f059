"""PostgreSQL gives every indexed text column (a key, a unique or ``db_index=True`` one) a second,
``varchar_pattern_ops`` index, ``..._like``, for ``LIKE 'prefix%'``. durable runs no such query on
them, so they only cost every write: migrations that add such columns drop them again. (Indexes
declared in ``Meta.indexes`` get no twin: prefer them for new columns.)"""


def drop_pattern_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename LIKE 'durable\\_%%' AND indexname LIKE 'durable\\_%%\\_like'"
        )
        for (name,) in cursor.fetchall():
            schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")
