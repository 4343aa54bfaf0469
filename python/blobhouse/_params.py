"""Statement parameters: Python values as one Arrow batch (a row per
execution), bound by the engine as typed SQL literals
(``blobhouse_engine::placeholders``) — never spliced into the text."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import pyarrow as _pa

from . import _blobhouse
from ._blobhouse import ProgrammingError

def _param_rows_batch(rows: Sequence[Sequence[Any]]) -> "_pa.RecordBatch":
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ProgrammingError(f"parameter row {i + 1} has {len(row)} values, the first has {width}")
    columns = []
    for i in range(width):
        values = [_bindable(row[i]) for row in rows]
        try:
            columns.append(_pa.array(values))
        except (_pa.ArrowInvalid, _pa.ArrowTypeError, OverflowError) as e:
            raise ProgrammingError(f"parameter {i + 1}: cannot bind {values[0]!r} ({type(values[0]).__name__}): {e}") from None
    return _pa.RecordBatch.from_arrays(columns, names=[f"p{i + 1}" for i in range(width)])


def _bindable(value: Any) -> Any:
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if type(value).__name__ == "UUID":
        return str(value)
    return value


def _check_sequence(parameters: Any) -> Sequence[Any]:
    if isinstance(parameters, Mapping):
        raise ProgrammingError("parameters are positional (paramstyle qmark: ?, or $1): pass a sequence, not a mapping")
    if isinstance(parameters, (str, bytes)):
        raise ProgrammingError("parameters must be a sequence of values, e.g. (value,), not a string")
    return list(parameters)


def _bind(sql: str, parameters: Optional[Sequence[Any]]) -> str:
    if parameters is None:
        return sql
    values = _check_sequence(parameters)
    if not values:
        # No values: the engine still checks that the statement wants none.
        return _blobhouse.bind(sql, _pa.RecordBatch.from_pylist([]))[0]
    return _blobhouse.bind(sql, _param_rows_batch([values]))[0]


def _bind_many(sql: str, seq_of_parameters: Iterable[Sequence[Any]]) -> list[str]:
    rows = [_check_sequence(p) for p in seq_of_parameters]
    if not rows:
        return []
    try:
        return _blobhouse.bind(sql, _param_rows_batch(rows))
    except ProgrammingError:
        # Values of different types in one column: bind row by row.
        return [_bind(sql, row) for row in rows]
