"""The DB-API 2.0 cursor."""

from __future__ import annotations

import warnings as _warnings
from collections import deque as _deque
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Sequence

import pyarrow as _pa

from . import _blobhouse
from ._blobhouse import InterfaceError, ProgrammingError
from ._convert import _rows
from ._params import _bind, _bind_many

if TYPE_CHECKING:
    from .connection import Connection

class Cursor:
    """A cursor (PEP 249): runs statements on its connection and fetches
    their rows, which are computed as they are fetched."""

    def __init__(self, connection: Connection) -> None:
        #: The connection it runs on.
        self.connection = connection
        #: Rows ``fetchmany()`` returns by default.
        self.arraysize = 1
        self._answer: "Optional[_blobhouse.Answer]" = None
        self._pending: "_deque[tuple]" = _deque()
        self._description: Optional[list[tuple]] = None
        self._rowcount = -1
        self._closed = False

    # -- PEP 249 attributes

    @property
    def description(self) -> Optional[list[tuple]]:
        """Per column of the last result: (name, type_code, display_size,
        internal_size, precision, scale, null_ok). The type code is the SQL
        type name (``BIGINT``, ``DECIMAL(15,2)``); compare it with
        ``blobhouse.NUMBER``, ``STRING``, ``DATETIME``, ``BINARY``. ``None``
        after a statement that returns no rows."""
        return self._description

    @property
    def rowcount(self) -> int:
        """Rows changed by the last INSERT, UPDATE, DELETE, COPY or CREATE
        TABLE AS (all of ``executemany``'s together); rows of a result once
        all are fetched; otherwise -1."""
        return self._rowcount

    lastrowid = None

    def setinputsizes(self, sizes: Any) -> None:
        """Does nothing (PEP 249 allows it)."""

    def setoutputsize(self, size: Any, column: Optional[int] = None) -> None:
        """Does nothing (PEP 249 allows it)."""

    # -- running

    def execute(self, operation: str, parameters: Optional[Sequence[Any]] = None) -> "Cursor":
        """Runs one statement, ``?`` (or ``$1``…) bound to ``parameters``.
        A query's rows are computed as they are fetched."""
        self._check_open()
        sql = _bind(operation, parameters)
        self._reset()
        self._set(self.connection._execute(sql))
        return self

    def executemany(self, operation: str, seq_of_parameters: Iterable[Sequence[Any]]) -> "Cursor":
        """Runs one statement once per row of parameters; ``rowcount`` is
        the sum of their counts."""
        self._check_open()
        statements = _bind_many(operation, seq_of_parameters)
        self._reset()
        total = 0
        for sql in statements:
            answer = self.connection._execute(sql)
            total += max(answer.rowcount, 0)
            answer.close()
        self._rowcount = total if statements else -1
        return self

    def close(self) -> None:
        """Closes the cursor; a running statement stops."""
        self._reset()
        self._closed = True

    def nextset(self) -> None:
        """There is one result set per statement: ``None``."""
        self._check_result()
        return None

    # -- fetching

    def fetchone(self) -> Optional[tuple]:
        """The next row, or ``None`` after the last."""
        self._check_result()
        if not self._pending and not self._fill():
            return None
        return self._pending.popleft()

    def fetchmany(self, size: Optional[int] = None) -> list[tuple]:
        """Up to ``size`` (default ``arraysize``) next rows."""
        self._check_result()
        size = self.arraysize if size is None else size
        out: list[tuple] = []
        while len(out) < size:
            if not self._pending and not self._fill():
                break
            take = min(size - len(out), len(self._pending))
            out.extend(self._pending.popleft() for _ in range(take))
        return out

    def fetchall(self) -> list[tuple]:
        """Every remaining row."""
        self._check_result()
        out = list(self._pending)
        self._pending.clear()
        while self._fill():
            out.extend(self._pending)
            self._pending.clear()
        return out

    def fetch_arrow_table(self) -> "_pa.Table":
        """Every remaining row as a ``pyarrow.Table``."""
        reader = self.fetch_record_batch()
        return reader.read_all()

    def fetch_record_batch(self, rows_per_batch: Optional[int] = None) -> "_pa.RecordBatchReader":
        """The remaining rows as a ``pyarrow.RecordBatchReader``: each batch
        is computed when it is read, so a result of any size streams.
        ``rows_per_batch`` re-cuts the engine's batches."""
        self._check_result()
        answer = self._answer
        schema = answer.schema
        leftover = list(self._pending)
        self._pending.clear()

        def batches() -> Iterator["_pa.RecordBatch"]:
            if leftover:
                yield _pa.RecordBatch.from_pylist([dict(zip(schema.names, r)) for r in leftover], schema=schema)
            while True:
                batch = answer.next_batch()
                if batch is None:
                    return
                yield batch

        if rows_per_batch is None and not leftover:
            reader = _pa.RecordBatchReader.from_stream(answer)
        else:
            reader = _pa.RecordBatchReader.from_batches(schema, batches())
        if rows_per_batch is not None:
            return _pa.RecordBatchReader.from_batches(schema, _recut(reader, rows_per_batch))
        return reader

    def df(self) -> Any:
        """Every remaining row as a pandas DataFrame."""
        return self.fetch_arrow_table().to_pandas()

    def pl(self) -> Any:
        """Every remaining row as a Polars DataFrame."""
        import polars

        return polars.from_arrow(self.fetch_arrow_table())

    fetchdf = df

    # -- iteration and context

    def __iter__(self) -> "Cursor":
        return self

    def __next__(self) -> tuple:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection._check_open()

    def _check_result(self) -> None:
        self._check_open()
        if self._answer is None or self._description is None:
            raise ProgrammingError("no result to fetch: the last statement returned no rows (or none was run)")

    def _reset(self) -> None:
        if self._answer is not None:
            self._answer.close()
        self._answer = None
        self._pending.clear()
        self._description = None
        self._rowcount = -1

    def _set(self, answer: "_blobhouse.Answer") -> None:
        self._answer = answer
        self._rowcount = answer.rowcount
        for severity, code, message in answer.notices:
            # The server's notices (PostgreSQL's NOTICE/WARNING) as Python
            # warnings; PEP 249's `Warning` is an exception, not a category.
            _warnings.warn(f"{severity} {code}: {message}", UserWarning, stacklevel=3)
        if answer.returns_rows:
            schema = answer.schema
            self._description = [
                (field.name, type_name, None, None, *_precision_scale(field.type), field.nullable)
                for field, type_name in zip(schema, answer.type_names)
            ]
            self._fetched = 0
        else:
            answer.close()

    def _fill(self) -> bool:
        """Reads the next batch into the pending rows; False at the end."""
        answer = self._answer
        if answer is None:
            return False
        while True:
            batch = answer.next_batch()
            if batch is None:
                self._rowcount = self._fetched
                return False
            if batch.num_rows:
                rows = _rows(batch)
                self._fetched += len(rows)
                self._pending.extend(rows)
                return True


def _precision_scale(t: "_pa.DataType") -> tuple:
    if _pa.types.is_decimal(t):
        return (t.precision, t.scale)
    return (None, None)


def _recut(reader: "_pa.RecordBatchReader", rows: int) -> Iterator["_pa.RecordBatch"]:
    if rows < 1:
        raise ValueError("rows_per_batch must be at least 1")
    held: list = []
    count = 0
    for batch in reader:
        held.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = _pa.Table.from_batches(held)
            yield from table.slice(0, rows).to_batches(max_chunksize=rows)
            rest = table.slice(rows)
            held = rest.to_batches()
            count = rest.num_rows
    if count:
        yield from _pa.Table.from_batches(held, schema=reader.schema).to_batches(max_chunksize=rows)
