"""An .rrd file read back with rerun's own reader (rerun.chunk.RrdReader), for the tests
of what RerunSink and `tap --rerun` log. Needs rerun-sdk (the 'rerun' extra)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
from rerun.chunk import RrdReader


def read_back(path: Path, timed: bool = True) -> dict[str, dict[str, list[Any]]]:
    """{entity: {column: values}} over every chunk of the file's recording, rows in
    event-time order, event_time in seconds; the rows logged without one are left
    out, or with timed False kept, in the order logged, their event_time None."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for chunk in RrdReader(path).stream():
        batch = chunk.to_record_batch()
        columns = {name: (column.cast(pa.int64()) if pa.types.is_timestamp(column.type)
                          else column).to_pylist()  # nanoseconds, as they were logged
                   for name, column in zip(batch.schema.names, batch.columns, strict=True)}
        rows[chunk.entity_path].extend(
            dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True))
    entities: dict[str, dict[str, list[Any]]] = {}
    for entity, got in rows.items():
        if timed:
            got = sorted((r for r in got if r.get("event_time") is not None),
                         key=lambda r: r["event_time"])
        entities[entity] = {column: [r.get(column) for r in got]
                            for column in {c for r in got for c in r}}
        entities[entity]["event_time"] = [
            None if r.get("event_time") is None else r["event_time"] / 1e9 for r in got]
    return entities


def texts(entity: dict[str, list[Any]]) -> list[str]:
    """A TextLog entity's lines (each row a batch of one)."""
    return [one for (one,) in entity["TextLog:text"]]
