"""blobhouse: an analytical SQL database whose tables live in object storage,
embedded in the Python process.

    >>> import blobhouse
    >>> con = blobhouse.connect("./mydb", autocommit=True)      # or s3://bucket/db, gs://…, az://…
    >>> con.execute("CREATE TABLE t (id BIGINT, name VARCHAR)")
    >>> con.execute("INSERT INTO t VALUES (?, ?)", (1, "a"))
    >>> con.sql("SELECT * FROM t").df()                          # .arrow(), .pl(), .fetchall()

The connection speaks DB-API 2.0 (PEP 249): cursors, ``execute`` with ``?``
or ``$1`` parameters, ``fetch*``, ``commit``/``rollback`` on blobhouse's
transactions and the standard exceptions, each with the engine's message and
its ``.sqlstate``. Results stream as Arrow batches computed while they are
read: ``Cursor.fetch_record_batch()`` and every relation's
``__arrow_c_stream__`` hand them to pyarrow, Polars and DuckDB without a
copy. The engine runs with the GIL released, and Ctrl-C stops a running
statement with ``KeyboardInterrupt``. See docs/python.md.
"""

from __future__ import annotations

import os as _os
from typing import Any, Mapping, Optional, Sequence

from . import _blobhouse
from ._blobhouse import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)

__version__: str = _blobhouse.__version__

#: PEP 249: the DB-API level supported.
apilevel = "2.0"
#: PEP 249: threads may share the module, not connections (give each
#: thread its own ``connect()``; connections to one database share its
#: engine, caches and memory).
threadsafety = 1
#: PEP 249: ``?`` placeholders; ``$1``, ``$2`` … work too.
paramstyle = "qmark"

__all__ = [
    "connect", "Connection", "Cursor", "Relation", "apilevel", "threadsafety", "paramstyle",
    "Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
    "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError",
    "Date", "Time", "Timestamp", "DateFromTicks", "TimeFromTicks", "TimestampFromTicks", "Binary",
    "STRING", "BINARY", "NUMBER", "DATETIME", "ROWID",
]
from .connection import Connection
from .cursor import Cursor
from .dbapi_types import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
)
from .relation import Relation


def connect(
    database: "str | _os.PathLike[str]" = "memory://",
    *,
    autocommit: bool = False,
    store_options: Optional[Mapping[str, str]] = None,
    workers: Optional[Sequence[str]] = None,
    **options: Any,
) -> "Connection":
    """Opens the database at ``database`` and returns a connection to it.

    ``database`` is a URL, as for the ``blobhouse`` command's ``--db``: a
    local path, ``file:///path``, ``s3://bucket/prefix``, ``gs://…``,
    ``az://container/prefix`` or ``memory://`` (the default: gone with the
    process). A database that does not exist is created (``create=False``
    refuses instead).

    Keyword options are the command line's flags, ``-`` written ``_``:

    - store: ``endpoint``, ``access_key_id``, ``secret_access_key``,
      ``region``, ``allow_http``, ``virtual_hosted_style``, and
      ``store_options={"azure_storage_account_name": …}`` (object_store's
      keys); encryption: ``encryption_key_file``, ``encryption_key_env``,
      ``kms_key_id``, ``kms_endpoint``;
    - engine: ``threads``, ``memory_limit`` ("4G", "60%", "none"),
      ``spill_dir``, ``spill_limit``, ``allow_plaintext_spill``,
      ``cache_memory``, ``cache_decoded_ratio``, ``cache_dir`` (the SSD
      cache), ``cache_ssd_size``, ``chunk_mib``;
    - a storage node: ``storage_node="http://node:50061"``,
      ``storage_node_token_env``, ``storage_node_ca``, ``pushdown``;
    - a cluster: ``workers=["http://w1:50071", …]``,
      ``cluster_token_env``, ``worker_ca``.

    ``autocommit=False`` (PEP 249's default): the first statement opens a
    transaction, which ``commit()`` commits and ``rollback()`` or
    ``close()`` rolls back. ``autocommit=True``: each statement commits
    on its own.
    """
    settings: dict[str, str] = {}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            settings[name] = "true" if value else "false"
        elif isinstance(value, (str, int, float)) or hasattr(value, "__fspath__"):
            settings[name] = _os.fspath(value) if hasattr(value, "__fspath__") else str(value)
        else:
            raise TypeError(f"connect(): option {name} takes a string, number, path or bool, not {type(value).__name__}")
    inner = _blobhouse.Connection.open(
        _os.fspath(database),
        settings,
        {str(k): str(v) for k, v in (store_options or {}).items()},
        [str(w) for w in (workers or [])],
    )
    return Connection(inner, autocommit=autocommit)


# Statements that begin, end or cannot run inside a transaction: autocommit
# off does not open one before them.
