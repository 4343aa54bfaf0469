"""PEP 249's type constructors and type objects. A cursor's type codes are
SQL type names (``BIGINT``, ``DECIMAL(15,2)``); each type object equals the
names of its family."""

from __future__ import annotations

import datetime as _datetime
import time as _time

Date = _datetime.date
Time = _datetime.time
Timestamp = _datetime.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> _datetime.date:
    """The local date of ``ticks`` seconds since the epoch."""
    return Date(*_time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> _datetime.time:
    """The local time of day of ``ticks`` seconds since the epoch."""
    return Time(*_time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> _datetime.datetime:
    """The local date and time of ``ticks`` seconds since the epoch."""
    return Timestamp(*_time.localtime(ticks)[:6])


class _TypeObject:
    """A PEP 249 type object: equal to every type code (a SQL type name,
    as ``Cursor.description`` gives it) of its family."""

    def __init__(self, name: str, *prefixes: str) -> None:
        self.name = name
        self.prefixes = prefixes

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _TypeObject):
            return other is self
        return isinstance(other, str) and other.upper().startswith(self.prefixes)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"blobhouse.{self.name}"


STRING = _TypeObject("STRING", "VARCHAR", "TEXT", "CHAR")
BINARY = _TypeObject("BINARY", "BYTEA", "BINARY", "VARBINARY", "BLOB")
NUMBER = _TypeObject("NUMBER", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "REAL", "DOUBLE", "HALF FLOAT", "DECIMAL", "FLOAT")
DATETIME = _TypeObject("DATETIME", "DATE", "TIME", "TIMESTAMP", "INTERVAL")
ROWID = _TypeObject("ROWID")
