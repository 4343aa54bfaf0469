"""Relations: a query's rows read on demand, by Arrow consumers and into
pandas and Polars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Optional

import pyarrow as _pa

from . import _blobhouse
from ._convert import _rows

if TYPE_CHECKING:
    from .connection import Connection

class Relation:
    """A query's rows, read on demand: ``.arrow()``, ``.df()``, ``.pl()``,
    ``.fetchall()``, or any Arrow consumer (``pyarrow``, Polars, DuckDB)
    through ``__arrow_c_stream__``, each batch computed as it is pulled.
    Each read after the first runs the query again."""

    def __init__(self, connection: Connection, sql: str, answer: "Optional[_blobhouse.Answer]") -> None:
        self._connection = connection
        self._sql = sql
        self._answer = answer

    def _take(self) -> "_blobhouse.Answer":
        answer, self._answer = self._answer, None
        if answer is None:
            answer = self._connection._execute(self._sql)
        return answer

    @property
    def query(self) -> str:
        """The SQL it runs."""
        return self._sql

    @property
    def schema(self) -> "_pa.Schema":
        """The columns' names and Arrow types."""
        if self._answer is not None:
            return self._answer.schema
        answer = self._connection._execute(self._sql)
        try:
            return answer.schema
        finally:
            answer.close()

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The rows as an Arrow C stream (the PyCapsule interface)."""
        return self._take().__arrow_c_stream__(requested_schema)

    def record_batch(self) -> "_pa.RecordBatchReader":
        """The rows as a streaming ``pyarrow.RecordBatchReader``."""
        answer = self._take()

        def batches() -> Iterator["_pa.RecordBatch"]:
            while True:
                batch = answer.next_batch()
                if batch is None:
                    return
                yield batch

        return _pa.RecordBatchReader.from_batches(answer.schema, batches())

    def arrow(self) -> "_pa.Table":
        """Every row as a ``pyarrow.Table``."""
        answer = self._take()
        batches = []
        while True:
            batch = answer.next_batch()
            if batch is None:
                break
            batches.append(batch)
        return _pa.Table.from_batches(batches, schema=answer.schema)

    to_arrow_table = arrow

    def df(self) -> Any:
        """Every row as a pandas DataFrame."""
        return self.arrow().to_pandas()

    to_df = df

    def pl(self) -> Any:
        """Every row as a Polars DataFrame."""
        import polars

        return polars.from_arrow(self.arrow())

    def fetchall(self) -> list[tuple]:
        """Every row as a tuple."""
        answer = self._take()
        out: list[tuple] = []
        while True:
            batch = answer.next_batch()
            if batch is None:
                return out
            out.extend(_rows(batch))

    def fetchone(self) -> Optional[tuple]:
        """The first row (the rest are not computed)."""
        rows = self._head(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int = 1) -> list[tuple]:
        """The first ``size`` rows (the rest are not computed)."""
        return self._head(size)

    def _head(self, n: int) -> list[tuple]:
        answer = self._take()
        out: list[tuple] = []
        try:
            while len(out) < n:
                batch = answer.next_batch()
                if batch is None:
                    break
                out.extend(_rows(batch.slice(0, n - len(out))))
        finally:
            answer.close()
        return out

    def show(self, n: int = 10) -> None:
        """Prints the first ``n`` rows."""
        print(self._text(n))

    def _text(self, n: int) -> str:
        answer = self._take()
        schema = answer.schema
        batches, count = [], 0
        try:
            while count <= n:
                batch = answer.next_batch()
                if batch is None:
                    break
                batches.append(batch)
                count += batch.num_rows
        finally:
            answer.close()
        table = _pa.Table.from_batches(batches, schema=schema)
        head = table.slice(0, n)
        rows = [row for batch in head.to_batches() for row in _rows(batch)]
        cells = [list(schema.names)] + [["NULL" if v is None else str(v) for v in r] for r in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(schema.names))]
        line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |", line]
        out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
        out.append(line)
        more = table.num_rows > n
        out.append(f"{len(rows)} row{'s' if len(rows) != 1 else ''}{' shown (more follow)' if more else ''}")
        return "\n".join(out)

    def __repr__(self) -> str:
        return self._text(10)

    def _repr_html_(self) -> str:
        """The first 10 rows as an HTML table (Jupyter)."""
        import html

        answer = self._take()
        schema = answer.schema
        rows: list[tuple] = []
        more = False
        try:
            while len(rows) <= 10:
                batch = answer.next_batch()
                if batch is None:
                    break
                rows.extend(_rows(batch))
            more = len(rows) > 10
        finally:
            answer.close()
        head = "".join(f"<th>{html.escape(name)}<br><small>{html.escape(str(t))}</small></th>" for name, t in zip(schema.names, schema.types))
        body = "".join("<tr>" + "".join(f"<td>{'<i>NULL</i>' if v is None else html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows[:10])
        note = "<p><small>first 10 rows shown</small></p>" if more else ""
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"
