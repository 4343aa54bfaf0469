"""Arrow to Python and Python to Arrow: result batches as rows of Python
values, and user data (DataFrames, tables, dicts) as Arrow streams."""

from __future__ import annotations

from typing import Any, Mapping

import pyarrow as _pa
import pyarrow.compute as _pc

def _pythonable(batch: "_pa.RecordBatch") -> "_pa.RecordBatch":
    """``batch`` with nanosecond times as microseconds: Python's datetime
    holds microseconds, and pyarrow would hand out pandas Timestamps."""
    columns = []
    changed = False
    for column in batch.columns:
        t = column.type
        if (_pa.types.is_timestamp(t) or _pa.types.is_time64(t) or _pa.types.is_duration(t)) and t.unit == "ns":
            target = _pa.timestamp("us", t.tz) if _pa.types.is_timestamp(t) else (_pa.time64("us") if _pa.types.is_time64(t) else _pa.duration("us"))
            column = _pc.cast(column, target, safe=False)
            changed = True
        columns.append(column)
    return _pa.RecordBatch.from_arrays(columns, names=batch.schema.names) if changed else batch


def _rows(batch: "_pa.RecordBatch") -> list[tuple]:
    batch = _pythonable(batch)
    return list(zip(*(column.to_pylist() for column in batch.columns))) if batch.num_columns else [()] * batch.num_rows


def _arrow_stream(data: Any) -> Any:
    """``data`` as an object with ``__arrow_c_stream__``."""
    if hasattr(data, "__arrow_c_stream__"):
        return data
    if type(data).__module__.startswith("pandas"):
        return _pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):
        return _pa.table(dict(data))
    if isinstance(data, (_pa.RecordBatch,)):
        return _pa.Table.from_batches([data])
    raise TypeError(
        f"cannot read a {type(data).__name__} as a table: pass a pyarrow Table or RecordBatchReader, a pandas or Polars DataFrame, "
        "a dict of columns, or anything with __arrow_c_stream__"
    )
