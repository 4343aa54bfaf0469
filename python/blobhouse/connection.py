"""The DB-API 2.0 connection: one blobhouse session."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from . import _blobhouse
from ._blobhouse import InterfaceError, ProgrammingError
from ._convert import _arrow_stream
from ._params import _bind
from .cursor import Cursor
from .relation import Relation

_NO_IMPLICIT_BEGIN = ("BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "VACUUM")


def _first_word(sql: str) -> str:
    text = sql.lstrip()
    while text.startswith("--") or text.startswith("/*"):
        if text.startswith("--"):
            text = text.split("\n", 1)[1].lstrip() if "\n" in text else ""
        else:
            text = text.split("*/", 1)[1].lstrip() if "*/" in text else ""
    return text.split(None, 1)[0].rstrip(";").upper() if text else ""


class Connection:
    """A connection to one database (PEP 249): one blobhouse session — its
    settings, its transaction, the Python data registered on it. Use one
    per thread."""

    # PEP 249's optional extension: the exceptions as attributes, for code
    # that holds connections of several drivers.
    Warning = _blobhouse.Warning
    Error = _blobhouse.Error
    InterfaceError = _blobhouse.InterfaceError
    DatabaseError = _blobhouse.DatabaseError
    DataError = _blobhouse.DataError
    OperationalError = _blobhouse.OperationalError
    IntegrityError = _blobhouse.IntegrityError
    InternalError = _blobhouse.InternalError
    ProgrammingError = _blobhouse.ProgrammingError
    NotSupportedError = _blobhouse.NotSupportedError

    def __init__(self, inner: "_blobhouse.Connection", autocommit: bool = False) -> None:
        self._inner = inner
        self._autocommit = bool(autocommit)

    # -- PEP 249

    @property
    def autocommit(self) -> bool:
        """Whether each statement commits on its own."""
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        if value and not self._autocommit and self._inner.in_transaction:
            raise ProgrammingError("a transaction is open: commit() or rollback() it before turning autocommit on")
        self._autocommit = bool(value)

    def cursor(self) -> "Cursor":
        """A new cursor on this connection."""
        self._check_open()
        return Cursor(self)

    def commit(self) -> None:
        """Commits the open transaction; its changes become visible to
        others together. A conflict with a concurrent commit raises
        ``OperationalError`` with SQLSTATE 40001: run the transaction again."""
        self._check_open()
        self._inner.commit()

    def rollback(self) -> None:
        """Rolls the open transaction back."""
        self._check_open()
        self._inner.rollback()

    def close(self) -> None:
        """Closes the connection: an open transaction is rolled back (PEP
        249), registered data forgotten. A closed connection refuses every
        operation, a second close() too (``InterfaceError``)."""
        self._check_open()
        self._inner.close()

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Commits when the block succeeded, rolls back when it raised, and closes."""
        try:
            if not self.closed:
                if exc_type is None:
                    self.commit()
                else:
                    self.rollback()
        finally:
            if not self.closed:
                self.close()

    # -- conveniences (sqlite3's and DuckDB's)

    def execute(self, sql: str, parameters: Optional[Sequence[Any]] = None) -> "Cursor":
        """Runs ``sql`` on a new cursor and returns it."""
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]]) -> "Cursor":
        """Runs ``sql`` once per parameter row on a new cursor."""
        return self.cursor().executemany(sql, seq_of_parameters)

    def sql(self, query: str, parameters: Optional[Sequence[Any]] = None) -> "Optional[Relation]":
        """Runs ``query``. A query returns a :class:`Relation` whose rows
        stream when read (``.arrow()``, ``.df()``, ``.pl()``,
        ``.fetchall()``, or any Arrow consumer through
        ``__arrow_c_stream__``); any other statement runs now and returns
        ``None``."""
        sql = _bind(query, parameters)
        answer = self._execute(sql)
        if not answer.returns_rows:
            answer.close()
            return None
        return Relation(self, sql, answer)

    def table(self, name: str) -> "Relation":
        """All rows of table ``name``."""
        return Relation(self, f'SELECT * FROM "{name.replace(chr(34), chr(34) * 2)}"', None)

    def register(self, name: str, data: Any) -> "Connection":
        """Makes ``data`` readable as ``name`` in this connection's SQL —
        joined with stored tables, or inserted into one
        (``INSERT INTO t SELECT * FROM name``). ``data`` is anything with
        ``__arrow_c_stream__`` (pyarrow Table or RecordBatchReader, pandas
        ≥ 2.2 or Polars DataFrame, a DuckDB relation), a pandas DataFrame,
        or a dict of columns; its buffers are used in place, not copied."""
        self._check_open()
        self._inner.register(name, _arrow_stream(data))
        return self

    def unregister(self, name: str) -> "Connection":
        """Forgets a name given to :meth:`register`."""
        self._check_open()
        self._inner.unregister(name)
        return self

    def load(self, table: str, data: Any) -> int:
        """Appends ``data`` (as for :meth:`register`) to ``table``, creating
        it with the data's columns when it does not exist; the data is
        streamed once, so it may be larger than memory. Returns the rows
        loaded. With autocommit off the load is part of the open
        transaction."""
        self._begin_if_needed("INSERT")
        return self._inner.load(table, _arrow_stream(data))

    @property
    def url(self) -> str:
        """The database's URL."""
        return self._inner.url

    # -- internals

    def _check_open(self) -> None:
        if self._inner.closed:
            raise InterfaceError(f"the connection to {self._inner.url} is closed")

    def _begin_if_needed(self, sql: str) -> None:
        self._check_open()
        if not self._autocommit and not self._inner.in_transaction and _first_word(sql) not in _NO_IMPLICIT_BEGIN:
            self._inner.begin()

    def _execute(self, sql: str) -> "_blobhouse.Answer":
        self._begin_if_needed(sql)
        return self._inner.execute(sql)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<blobhouse.Connection {self._inner.url} ({state})>"
