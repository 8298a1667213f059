"""Rewrite stored payloads under the current codec and first key (``manage.py durable reencode``):
after a key rotation, so old keys can leave CODEC_KEYS, or after a codec was turned on."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.db import connections, models, transaction

from .. import codecs, conf
from ..errors import PayloadUndecodable
from ..models import offloads
from ..models.base import update_where
from ..models.payloads import PayloadField, fetched, opened

#: Rows read, checked and rewritten per transaction.
BATCH = 500


@dataclass
class Counts:
    """What one table's pass found: rows read, rows rewritten (or that would be, in a dry run)."""

    table: str
    read: int = 0
    rewritten: int = 0


def reencode(
    *, dry_run: bool = False, batch: int = BATCH, report: Callable[[Counts], None] | None = None
) -> list[Counts]:
    """Rewrite every payload column not yet written under the current codec and first key, a
    batch per transaction, table by table; return each table's counts. Rows already current are
    left alone, so a second pass rewrites nothing. ``PayloadUndecodable`` (naming the row) stops
    the pass at a row no configured codec decodes; the batches before it stay rewritten."""
    current = conf.first_key_codec()
    found = []
    for model in _payload_models():
        counts = Counts(model._meta.db_table)
        after: Any = None
        while True:
            with transaction.atomic(using=conf.get().DATABASE):
                rows = _batch(model, after, batch, lock=not dry_run)
                for pk, stored in rows:
                    counts.read += 1
                    stale = {name: value for name, value in stored.items() if not _is_current(value, current)}
                    if not stale:
                        continue
                    counts.rewritten += 1
                    if not dry_run:
                        # The rewrite offloads anew: the objects the old values were in go.
                        offloads.release_names(
                            [v["v"] for v in stale.values() if codecs.is_offloaded(v)], conf.get().DATABASE
                        )
                        update_where(
                            model, conf.get().DATABASE, _opened(model, pk, stale), {model._meta.pk.name: pk}
                        )
            if report is not None and len(rows) < batch:
                report(counts)
            if len(rows) < batch:
                break
            after = rows[-1][0]
        found.append(counts)
    return found


def _payload_models() -> list[type[models.Model]]:
    return [
        model
        for model in apps.get_app_config("durable").get_models()
        if any(isinstance(f, PayloadField) for f in model._meta.concrete_fields)
    ]


def _batch(
    model: type[models.Model], after: Any, size: int, *, lock: bool
) -> list[tuple[Any, dict[str, Any]]]:
    """Up to ``size`` rows past primary key ``after``: (pk, {payload field: its JSON as stored}),
    read past the field (which would decode), locked for the batch's transaction when writing."""
    db = conf.get().DATABASE
    connection = connections[db]
    quote = connection.ops.quote_name
    meta = model._meta
    fields = [f for f in meta.concrete_fields if isinstance(f, PayloadField)]
    pk = quote(meta.pk.column)
    sql = f"SELECT {pk}, {', '.join(quote(f.column) for f in fields)} FROM {quote(meta.db_table)}"
    params: list[Any] = []
    if after is not None:
        sql += f" WHERE {pk} > %s"
        params.append(after)
    sql += f" ORDER BY {pk} LIMIT {int(size)}"
    if lock and connection.features.has_select_for_update:
        # A turn that writes one of these rows meanwhile waits for the batch: no rewrite
        # puts back a value older than the one it just wrote.
        sql += " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        (row[0], {f.name: _json(value) for f, value in zip(fields, row[1:], strict=True)}) for row in rows
    ]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _is_current(stored: Any, current: codecs.Chain | None) -> bool:
    """Whether a column holds what a write under the current settings would: plain JSON with no
    codec; an envelope the first key alone opens with one."""
    if stored is None:
        return True
    if codecs.is_offloaded(stored):
        stored = fetched(stored)
    if current is None:
        return not codecs.is_sealed(stored)
    if not codecs.is_sealed(stored):
        return False
    try:
        codecs.unseal(stored, current)
    except PayloadUndecodable:
        return False
    return True


def _opened(model: type[models.Model], pk: Any, stale: dict[str, Any]) -> dict[str, Any]:
    try:
        return {name: opened(stored) for name, stored in stale.items()}
    except PayloadUndecodable as exc:
        raise PayloadUndecodable(f"{model._meta.db_table} row {pk!r}: {exc.message}") from None
