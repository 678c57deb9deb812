"""The ``embedded:PATH`` store: a durable store in a local directory, shared by processes.

One SQLite database in write-ahead-log mode holds everything, so any number of threads and
processes on one machine (the oracle, workers, Spark executors) can use the same directory at
once.  The semantics are those of HBase through Thrift-1, as written in
:mod:`percolator.store.base`; the ``memory:`` store is the reference.

What is atomic and durable
--------------------------
* Every write call (:meth:`~EmbeddedStore.put`, :meth:`~EmbeddedStore.delete_versions`,
  :meth:`~EmbeddedStore.compare_and_set_many` with its puts, a batch of any size) is all of
  it or nothing, across processes.  For puts the store says so
  (:attr:`~percolator.store.base.Store.put_is_atomic`); for the rest it is more than the
  contract promises, and callers must not rely on it.
* **Group commit.**  Write calls of one process's threads that arrive while another is
  being written queue up and run together, in queue order, in **one** SQLite
  ``BEGIN IMMEDIATE`` transaction, each in a savepoint of its own (a failing call undoes
  only itself; a call alone needs none); each returns after that transaction committed
  (:class:`_WriteGroups`).
* A compare-and-set's ``then_put`` is written in its transaction, only if it applied
  (``conditional_puts``).
* **Statements, not rows.**  Inside the write mutex every SQLite step hands the GIL to
  another thread and must win it back, so a write call runs a few statements of up to 64
  rows each (``executemany`` would step once per row).  Compare-and-sets of many cells
  read the table, the store clock and every cell's newest version in one statement per
  64 cells, and write in one more (:meth:`EmbeddedStore._compare_and_set_batch`).
* :meth:`~EmbeddedStore.compare_and_set` reads and writes inside an ``IMMEDIATE``
  transaction, which holds the database's single write lock: it is atomic against every
  thread and process.  Its version is ``max(store clock, version of the cell just
  compared)``, as in HBase 2; the store clock is ``max(wall-clock ms, last clock)``,
  persisted in the database, so it never goes backwards, even across processes and
  restarts.  The written value is always the newest version of its cell.
* A read of several rows, and each batch of a scan, runs in one read transaction (a
  snapshot).  Only single rows are promised to be consistent.  A read of up to 64 explicit
  cells of a table read before is a single statement, which SQLite runs in a read
  transaction of its own (see :meth:`EmbeddedStore.read_rows`): every SQLite statement
  costs a GIL hand-off, and the common read needs one instead of four.
* A committed call survives the crash (``kill -9``) of any process, including the one that
  made it: SQLite's write-ahead log is replayed by the next connection.  The log is synced
  at checkpoints, not at every commit (``synchronous=NORMAL``): after a power loss or an
  operating-system crash the newest commits may be gone, but the database keeps a
  consistent prefix of its history.  Checkpoints (copying the log into the database) run
  in a thread of the writing process (:class:`_Checkpointer`), not in the commit of
  whichever write crossed SQLite's threshold.
* Errors: a write lock not obtained within ``busy_timeout_s`` (another process holds it,
  for example one stopped with SIGSTOP) raises :class:`StoreUnavailableError` and nothing
  was written; any other SQLite failure raises :class:`StoreError`.

Delete masks are kept until :meth:`EmbeddedStore.compact_deletes` forgets a table's (as
HBase drops its delete markers at a major compaction; garbage collection calls it after each
pass): meanwhile a put at or below a deleted version of the same cell is silently dropped,
also a compare-and-set whose stamp falls under it.  The mask table holds one row per deleted
cell.

On-disk format (format version 1)
---------------------------------
``PATH/percolator-store.sqlite3`` (plus SQLite's ``-wal`` and ``-shm`` files) holds::

    meta(key TEXT PRIMARY KEY, value)                      -- WITHOUT ROWID
        'format'         = 'percolator-embedded-store'
        'format_version' = 1
        'next_table_id'  = id of the next table created (ids are never reused)
        'clock_ms'       = the store clock: last compare-and-set clock reading, in ms
    tables(name TEXT PRIMARY KEY, id INTEGER UNIQUE,
           families TEXT)                                  -- WITHOUT ROWID
        families: JSON list of {"name", "max_versions", "in_memory", "block_cache"}
    cells(tid INTEGER, family TEXT, row BLOB, qualifier BLOB, version INTEGER, value BLOB,
          PRIMARY KEY (tid, family, row, qualifier, version DESC))   -- WITHOUT ROWID
    delete_masks(tid INTEGER, family TEXT, row BLOB, qualifier BLOB, at_or_below INTEGER,
          PRIMARY KEY (tid, family, row, qualifier))                 -- WITHOUT ROWID

SQLite compares BLOBs with ``memcmp``, so rows sort as unsigned bytes like HBase's, and
the primary key makes a row read or a family scan one index range scan that meets a cell's
newest version first.  A family with a finite ``max_versions`` is pruned on every write.

Cost: a read of explicit columns seeks each cell's newest version below ``before``
directly.  A read of whole families and a scan visit every version below ``before`` of the
cells they return (one statement for many rows), so they slow down on cells with many
versions that garbage collection has not trimmed yet.

A directory is accepted if it does not exist yet (it is created), is empty, or already
holds the database; anything else is refused with :class:`StoreError`, so pointing the
store at the wrong directory never scatters files into it.  A database file that is not a
store (another SQLite database, or not SQLite at all) is refused before anything is written
to it.  ``EmbeddedStore(path, create=False)`` opens only a store that already exists: the
directory, the file and the schema are never created, and a database file with nothing in
it (an empty file, say) raises :class:`~percolator.errors.StoreNotFoundError` and is left
byte for byte as it was.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, TypeVar

from percolator.errors import (
    InvalidArgumentError,
    PercolatorError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
    TableExistsError,
    TableNotFoundError,
)
from percolator.store.base import (
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
    split_cells,
)
from percolator.store.checks import (
    MAX_BEFORE,
    UNLIMITED_VERSIONS,
    cas_matches,
    check_compare_and_set,
    check_compare_and_sets,
    check_delete,
    check_family_name,
    check_family_specs,
    check_put,
    check_read_args,
    check_scan_options,
    check_sequence,
    check_table_name,
    selection_by_family,
)

log = logging.getLogger(__name__)


def _sqlite_uri(db_path: str, mode: str) -> str:
    """The ``file:`` URI of ``db_path``, percent-escaped: a ``?``, ``#`` or ``%`` in a path
    would otherwise end the path there (``/d/a?x`` would open the file ``/d/a``)."""
    return f"file:{urllib.parse.quote(db_path)}?mode={mode}"


DB_FILE = "percolator-store.sqlite3"
FORMAT_NAME = "percolator-embedded-store"
FORMAT_VERSION = 1
# Files SQLite keeps next to the database; a directory holding only these is ours.
_DB_FILES = {DB_FILE, DB_FILE + "-wal", DB_FILE + "-shm", DB_FILE + "-journal"}
# How long the checkpointer lets writes pile up in the log before copying them into the
# database (a page written several times in that window is copied once), and the size of
# the log (pages) at which a writer copies it itself, should the checkpointer fall behind.
_CHECKPOINT_INTERVAL_S = 0.05
_WRITER_CHECKPOINT_PAGES = 20_000
_CHECKPOINT_BUSY_TIMEOUT_S = 0.1
_CHECKPOINT_STOP_WAIT_S = 5.0
# Rows per statement in multi-row reads (well below SQLite's bound-parameter limit).
_ROWS_PER_STATEMENT = 500

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS tables ("
    " name TEXT PRIMARY KEY, id INTEGER NOT NULL UNIQUE, families TEXT NOT NULL"
    ") WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS cells ("
    " tid INTEGER NOT NULL, family TEXT NOT NULL, row BLOB NOT NULL,"
    " qualifier BLOB NOT NULL, version INTEGER NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (tid, family, row, qualifier, version DESC)"
    ") WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS delete_masks ("
    " tid INTEGER NOT NULL, family TEXT NOT NULL, row BLOB NOT NULL,"
    " qualifier BLOB NOT NULL, at_or_below INTEGER NOT NULL,"
    " PRIMARY KEY (tid, family, row, qualifier)"
    ") WITHOUT ROWID",
)

# Write statements take many rows each (:func:`_write_rows`).  Inside the write mutex, every
# SQLite step releases the GIL and must win it back from the threads running Python, and
# ``executemany`` steps once per row: with a few threads busy, a group of batched calls
# spent twice as long holding the mutex as working in it.  One step per statement of up to
# :data:`_ROWS_PER_WRITE` rows keeps the hand-offs to a handful per call.
_ROWS_PER_WRITE = 64

# A put is dropped when a delete mask of its cell covers its version (HBase's delete
# marker); re-putting an existing version replaces the value (the later write wins: rows
# are inserted in the order given).  ``v`` holds (tid, family, row, qualifier, version,
# value) per put.
_PUT_ROWS_SQL = (
    "INSERT OR REPLACE INTO cells (tid, family, row, qualifier, version, value)"
    " SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6"
    " FROM ({values}) v WHERE NOT EXISTS ("
    "  SELECT 1 FROM delete_masks m WHERE m.tid = v.column1 AND m.family = v.column2"
    "  AND m.row = v.column3 AND m.qualifier = v.column4 AND m.at_or_below >= v.column5)"
)
_PUT_ONE_SQL = (
    "INSERT OR REPLACE INTO cells (tid, family, row, qualifier, version, value)"
    " SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE NOT EXISTS ("
    "  SELECT 1 FROM delete_masks WHERE tid = ?1 AND family = ?2 AND row = ?3"
    "  AND qualifier = ?4 AND at_or_below >= ?5)"
)
# Keep the newest ?5 versions of one cell.
_PRUNE_SQL = (
    "DELETE FROM cells WHERE tid = ?1 AND family = ?2 AND row = ?3 AND qualifier = ?4"
    " AND version < (SELECT version FROM cells WHERE tid = ?1 AND family = ?2 AND row = ?3"
    "  AND qualifier = ?4 ORDER BY version DESC LIMIT 1 OFFSET ?5 - 1)"
)
# Versions of a cell at or below (``<=``), or below (``<``), a bound: ORed, one term per
# cell, each seeks its cell in the primary key (SQLite's MULTI-INDEX OR; see
# :func:`_delete_rows_sql`).
_CELL_VERSIONS_TERM = "(tid = ? AND family = ? AND row = ? AND qualifier = ? AND version {op} ?)"
_MASK_ROWS_SQL = (
    "INSERT INTO delete_masks (tid, family, row, qualifier, at_or_below)"
    " SELECT * FROM ({values}) WHERE true ON CONFLICT (tid, family, row, qualifier)"
    " DO UPDATE SET at_or_below = max(at_or_below, excluded.at_or_below)"
)
# What compare-and-sets read, in one statement per 64 cells (:func:`_cas_read_sql`): the
# table, the store clock and the newest version of each cell.  Every statement inside the
# write mutex releases and re-takes the GIL, and while other threads run Python, re-taking
# it is what stretches the time the mutex is held.
_NEWEST_SQL = (
    "SELECT version, value FROM cells WHERE tid = t.id AND family = ? AND row = ?"
    " AND qualifier = ? ORDER BY version DESC LIMIT 1"
)
_VERSIONS_SQL = (
    "SELECT version, value FROM cells WHERE tid = ? AND family = ? AND row = ?"
    " AND qualifier = ? AND version < ? AND version >= ? ORDER BY version DESC LIMIT ?"
)
# Prefixed to a one-statement read of cells whose table id came from the cache: its first row
# (index -1) exists only if the table of that name still has that id.  Ids are never reused
# and a table's families never change, so the cached (id, families) is right exactly when
# this row is there, in the same snapshot as the cells.
_TABLE_STILL_SQL = "SELECT -1, NULL, NULL FROM tables WHERE id = ? AND name = ? UNION ALL "
# Explicit cells per statement of a read (7 parameters each, far below SQLite's limit).
_CELLS_PER_STATEMENT = 64


# What a compare-and-set of a single cell reads: as :func:`_cas_read_sql`, with the cell's
# newest version in plain columns (NULLs when it has none), so the common compare-and-set
# (a transaction's primary) has no JSON to encode and decode.
_CAS_READ_ONE_SQL = (
    "SELECT t.id, t.families, (SELECT value FROM meta WHERE key = 'clock_ms'),"
    " (SELECT version FROM cells WHERE tid = t.id AND family = ?2 AND row = ?3"
    "  AND qualifier = ?4 ORDER BY version DESC LIMIT 1),"
    " (SELECT value FROM cells WHERE tid = t.id AND family = ?2 AND row = ?3"
    "  AND qualifier = ?4 ORDER BY version DESC LIMIT 1)"
    " FROM tables t WHERE t.name = ?1"
)


@lru_cache(maxsize=2 * _CELLS_PER_STATEMENT)
def _cas_read_sql(cells: int, by: str) -> str:
    """One statement, one row: the table (found ``by`` its ``name`` or ``id``), its families,
    the store clock, and the newest version of ``cells`` cells as a JSON list of ``[index,
    version, hex(value)]`` (a cell without versions has no entry).  One row is one SQLite
    step, so one GIL hand-off inside the write mutex instead of one per cell.  Parameters:
    each cell's family, row and qualifier, then the table's name or id."""
    union = " UNION ALL ".join(
        f"SELECT {i} AS i, version, value FROM ({_NEWEST_SQL})" for i in range(cells)
    )
    return (
        "SELECT t.id, t.families, (SELECT value FROM meta WHERE key = 'clock_ms'),"
        f" (SELECT json_group_array(json_array(i, version, hex(value))) FROM ({union}))"
        f" FROM tables t WHERE t.{by} = ?"
    )


@lru_cache(maxsize=_CELLS_PER_STATEMENT)
def _versions_sql(cells: int) -> str:
    """One statement reading the versions of ``cells`` explicit cells, each tagged with its
    index: a read of a transaction's cell (lock, write record, data) is one statement, not
    three, so one seek per cell stays, and two statement round trips per read go."""
    return " UNION ALL ".join(
        f"SELECT {i}, version, value FROM ({_VERSIONS_SQL})" for i in range(cells)
    )


@lru_cache(maxsize=256)
def _values_sql(template: str, rows: int, width: int) -> str:
    """``template`` with ``{values}`` a VALUES list of ``rows`` rows of ``width`` parameters."""
    one = "(" + ",".join("?" * width) + ")"
    return template.format(values="VALUES " + ",".join([one] * rows))


@lru_cache(maxsize=256)
def _delete_rows_sql(op: str, rows: int) -> str:
    """A DELETE of the versions ``op`` (``<=`` or ``<``) a bound in each of ``rows`` cells."""
    return "DELETE FROM cells WHERE " + " OR ".join([_CELL_VERSIONS_TERM.format(op=op)] * rows)


def _put_rows_sql(rows: int) -> str:
    # One row needs no VALUES list (SQLite runs that as a co-routine): the plain form is
    # cheaper for the most common write, a single put.
    return _PUT_ONE_SQL if rows == 1 else _values_sql(_PUT_ROWS_SQL, rows, 6)


def _mask_rows_sql(rows: int) -> str:
    return _values_sql(_MASK_ROWS_SQL, rows, 5)


def _at_or_below_rows_sql(rows: int) -> str:
    return _delete_rows_sql("<=", rows)


def _below_rows_sql(rows: int) -> str:
    return _delete_rows_sql("<", rows)


def _put_rows(tid: int, puts: Iterable[Put]) -> list[tuple[Any, ...]]:
    """The rows of ``puts`` into table ``tid``, as :data:`_PUT_ROWS_SQL` takes them."""
    return [(tid, p.family, p.row, p.qualifier, p.version, p.value) for p in puts]


def _put_cells(puts: Iterable[Put]) -> list[tuple[str, bytes, bytes]]:
    """The cells ``puts`` write, as :meth:`EmbeddedStore._prune` takes them."""
    return [(p.family, p.row, p.qualifier) for p in puts]


def _write_rows(
    conn: sqlite3.Connection, sql: Callable[[int], str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """``rows`` through ``sql(n)`` (a statement taking ``n`` rows of parameters), up to
    :data:`_ROWS_PER_WRITE` rows per statement, in order."""
    for chunk in _chunks(rows, _ROWS_PER_WRITE):
        conn.execute(sql(len(chunk)), [value for row in chunk for value in row])


# --------------------------------------------------------------------------- process state
#
# SQLite connections must not cross a fork: a child opens its own, after closing the ones
# it inherited.  SQLite keeps per process what it knows of a database file (its locks, the
# mapping of the shared-memory index), shared by every connection of the process: a child
# whose inherited connections stayed open kept that knowledge and opened its own connections
# on it, so they held none of the file locks a process must hold (the child inherits none).
# Once the parent exited, another process opening the store took itself for the first user
# and rebuilt the index under the child's feet: measured, about 100 of 6,000 increments of
# one counter shared by the child and that process were lost.  Closing in the child is safe
# for the parent (file locks belong to each process; the gate below ensures none of the
# inherited connections is inside a transaction) and writes nothing (a closing connection
# checkpoints only if it can lock the whole file, which the parent's own lock prevents).
#
# Threads of one process take a per-database mutex before SQLite's write lock, so they
# queue in order instead of polling SQLite's busy handler (and, before that, join a write
# group: _WriteGroups).
#
# A fork waits until no thread of the process is inside SQLite (_SqliteGate): a thread in
# SQLite's C code may hold one of SQLite's own mutexes, or its write lock, and the child
# would inherit them held by a thread it does not have.  SQLite's mutexes then block the
# child's first call for ever; SQLite's lock state, kept per process and shared by all its
# connections, makes every write of the child wait for a write lock nothing in the child
# releases.  Every entry into SQLite below passes the gate; none calls user code inside it,
# so the forking thread is never inside itself.  A read transaction's connection is not
# held across user code either (a scan reads each batch whole before yielding it).

_pid = os.getpid()
_write_locks: dict[str, threading.Lock] = {}
_write_locks_guard = threading.Lock()
# Group commit's queues (one per database; see _WriteGroups), also fresh in a child.
_write_groups: dict[str, _WriteGroups] = {}
_live_stores: weakref.WeakSet[EmbeddedStore] = weakref.WeakSet()


class _SqliteGate:
    """Counts the threads inside SQLite; :meth:`close` (before a fork) stops new entries and
    waits until none is inside.  Re-entrant per thread."""

    __slots__ = ("_closed", "_cond", "_depth", "_inside")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._closed = False
        self._depth = threading.local()

    def __enter__(self) -> None:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                while self._closed:
                    self._cond.wait()
                self._inside += 1
        self._depth.n = depth + 1

    def __exit__(self, *exc: object) -> None:
        depth = self._depth.n - 1
        self._depth.n = depth
        if depth == 0:
            with self._cond:
                self._inside -= 1
                if self._inside == 0 and self._closed:
                    self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            while self._inside:
                self._cond.wait()

    def open(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()


_sqlite = _SqliteGate()


def _before_fork() -> None:
    _sqlite.close()


def _after_fork_in_parent() -> None:
    _sqlite.open()


def _after_fork_in_child() -> None:
    global _pid, _write_locks_guard, _sqlite
    _pid = os.getpid()
    _sqlite = _SqliteGate()  # the parent's is closed; nothing of the parent is inside here
    _write_locks_guard = threading.Lock()
    _write_locks.clear()
    _write_groups.clear()
    for store in list(_live_stores):
        store._close_parent_connections()


def _close_inherited(conn: sqlite3.Connection) -> None:
    """In a forked child, before it opens any connection: close one the parent opened (see
    above for why this is needed and safe)."""
    with suppress(sqlite3.Error):
        conn.close()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


def _write_lock(db_path: str) -> threading.Lock:
    with _write_locks_guard:
        lock = _write_locks.get(db_path)
        if lock is None:
            lock = _write_locks[db_path] = threading.Lock()
        return lock


def _write_group(db_path: str) -> _WriteGroups:
    with _write_locks_guard:
        groups = _write_groups.get(db_path)
        if groups is None:
            groups = _write_groups[db_path] = _WriteGroups()
        return groups


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _advance_clock(conn: sqlite3.Connection, last: int | str) -> int:
    """The store clock for a compare-and-set, inside the caller's write transaction:
    wall-clock milliseconds, never below the last stamp ``last`` read from ``meta`` (clocks
    of different processes, or one clock stepped back, must not make a later
    compare-and-set older than an earlier one); stored when it moved."""
    clock = max(_now_ms(), int(last))
    if clock != last:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'clock_ms'", (clock,))
    return clock


def _stamp(clock: int, newest_version: int | None) -> int:
    """The version a compare-and-set writes: as HBase 2 does, never below the version just
    compared, so the written value is the newest of its cell (an equal version is
    replaced)."""
    return clock if newest_version is None else max(clock, int(newest_version))


@lru_cache(maxsize=256)
def _decode_families(encoded: str) -> Mapping[str, FamilySpec]:
    return {
        spec["name"]: FamilySpec(
            name=spec["name"],
            max_versions=spec["max_versions"],
            in_memory=spec["in_memory"],
            block_cache=spec["block_cache"],
        )
        for spec in json.loads(encoded)
    }


def _encode_families(families: Sequence[FamilySpec]) -> str:
    return json.dumps(
        [
            {
                "name": spec.name,
                "max_versions": spec.max_versions,
                "in_memory": spec.in_memory,
                "block_cache": spec.block_cache,
            }
            for spec in families
        ]
    )


_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _marks(n: int) -> str:
    return ",".join("?" * n)


class EmbeddedStore(Store):
    """A durable store in a local directory.  See the module docstring for the guarantees.

    Thread-safe and usable from several processes at once (each thread of each process gets
    its own SQLite connection; a forked child opens new ones).  Picklable: an unpickled copy
    opens the same directory.
    """

    put_is_atomic = True
    conditional_puts = True
    calls_run_in_parallel = False

    def __init__(self, path: str, *, busy_timeout_s: float = 60.0, create: bool = True) -> None:
        """Open the store in ``path``, creating it there (directory, database and schema)
        unless ``create`` is false.  With ``create=False`` nothing is written before the
        database is known to be a store: a missing one, or a database file that holds
        nothing yet, raises :class:`~percolator.errors.StoreNotFoundError`; a file that is
        not a store raises :class:`~percolator.errors.StoreError`."""
        super().__init__()
        self.path = os.path.abspath(os.path.expanduser(path))
        self.url = f"embedded:{self.path}"
        self._db_path = os.path.join(self.path, DB_FILE)
        self._busy_timeout_s = busy_timeout_s
        self._create = create
        self._closed = False
        self._initialised = False
        self._local = threading.local()
        # Table name -> (id, families), filled by reads; see read_rows.
        self._tables: dict[str, tuple[int, Mapping[str, FamilySpec]]] = {}
        # Every connection this process opened for this store, by thread, so close() and
        # the cleanup of finished threads can close them.
        self._conns: dict[int, tuple[weakref.ref[threading.Thread], sqlite3.Connection]] = {}
        self._conns_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.write_lock = WriteLockStats()
        # Started by the first write transaction of this process (see _Checkpointer).
        self._checkpointer: _Checkpointer | None = None
        self._checkpointer_guard = threading.Lock()
        self._prepare_directory()
        try:
            self._initialise()
        except BaseException:
            self.close()
            raise
        self._initialised = True
        _live_stores.add(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.path, self._busy_timeout_s))

    # ------------------------------------------------------------------ opening

    def _prepare_directory(self) -> None:
        path = self.path
        if os.path.lexists(path) and not os.path.isdir(path):
            raise StoreError(f"embedded store path {path!r} exists and is not a directory")
        if not self._create:
            # Nothing is made: the directory and its database must be there already.
            if not os.path.isfile(self._db_path):
                raise StoreNotFoundError(
                    f"embedded store {path!r} does not exist (no {DB_FILE} in it)"
                )
        else:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create embedded store directory {path!r}: {exc.strerror}"
                ) from exc
        if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
            raise StoreError(
                f"embedded store directory {path!r} is not readable and writable by this user"
            )
        if not os.path.exists(self._db_path):
            others = sorted(set(os.listdir(path)) - _DB_FILES)
            if others:
                raise StoreError(
                    f"{path!r} is not an embedded store: it has no {DB_FILE} and is not "
                    f"empty (holds {', '.join(others[:5])}{', ...' if len(others) > 5 else ''})"
                    "; use an empty or new directory"
                )

    def _initialise(self) -> None:
        """Create the schema if the database is new (and ``create``); otherwise check its
        format."""
        with self._errors("open"):
            conn = self._conn()
            # Checked before the switch to WAL, which rewrites the header of a database in
            # another journal mode: a file that is not a store (or, without ``create``, one
            # that is not a store yet) is refused as it was found.  The common case, an
            # existing store, needs no write lock: opening must not wait for a process
            # that holds it.
            with self._read() as rconn:
                exists = self._check_format(rconn)
            if not exists and not self._create:
                raise StoreNotFoundError(
                    f"embedded store {self.path!r} does not exist: its {DB_FILE} is an "
                    "empty database, not a store; check the path"
                )
            # Switching to WAL needs a moment without other connections; a concurrent
            # first open may hold the file briefly, so retry within the busy timeout.
            deadline = time.monotonic() + self._busy_timeout_s
            while True:
                try:
                    with _sqlite:
                        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                    break
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"embedded store {self._db_path!r}: cannot switch to WAL mode (got {mode!r})"
                )
            if exists:
                return
            # A new store, unless a concurrent first open made it meanwhile.
            with self._write() as wconn:
                if not self._check_format(wconn):
                    for statement in _SCHEMA:
                        wconn.execute(statement)
                    wconn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("format", FORMAT_NAME),
                            ("format_version", FORMAT_VERSION),
                            ("next_table_id", 1),
                            ("clock_ms", 0),
                        ],
                    )

    def _check_format(self, conn: sqlite3.Connection) -> bool:
        """True for a store of this format, False for an empty database (a new store);
        raises StoreError for anything else."""
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if not names:
            return False
        meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in names else {}
        if meta.get("format") != FORMAT_NAME:
            raise StoreError(f"{self._db_path!r} is a SQLite database but not an embedded store")
        if meta.get("format_version") != FORMAT_VERSION:
            raise StoreError(
                f"embedded store {self._db_path!r} has format version "
                f"{meta.get('format_version')!r}; this version reads {FORMAT_VERSION}"
            )
        return True

    def _connect(self) -> sqlite3.Connection:
        # Only the first open of a store that may be created may create the file: a later
        # connection of a store whose file was removed must fail rather than start an empty
        # store, and so must an open that only reads (the file went away after the check).
        mode = "rwc" if self._create and not self._initialised else "rw"
        with _sqlite:
            conn = sqlite3.connect(
                _sqlite_uri(self._db_path, mode),
                uri=True,
                timeout=self._busy_timeout_s,
                isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE / BEGIN
                check_same_thread=False,  # close() may close it from another thread
                cached_statements=256,
            )
            try:
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA mmap_size=268435456")
                # The log is copied into the database by a thread of its own (_Checkpointer);
                # a writer copies it itself only if the log grew this large meanwhile.
                conn.execute(f"PRAGMA wal_autocheckpoint={_WRITER_CHECKPOINT_PAGES}")
            except sqlite3.Error:
                conn.close()
                raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use (and again in a forked child)."""
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.pid == _pid and not self._closed:
            return conn
        if self._closed:
            raise StoreError(f"embedded store {self.path!r} is closed")
        conn = self._connect()
        thread = threading.current_thread()
        with self._conns_lock:
            # Close connections of threads that have finished: nothing else can use them.
            for ident, (ref, old) in list(self._conns.items()):
                dead = ref()
                if dead is None or not dead.is_alive():
                    del self._conns[ident]
                    with _sqlite:
                        old.close()
            self._conns[id(thread)] = (weakref.ref(thread), conn)
        local.conn = conn
        local.pid = _pid
        return conn

    def _close_parent_connections(self) -> None:
        """In a forked child: close the parent's connections and drop the parent's
        checkpointer (its thread does not exist here; the child's first write starts one
        of its own)."""
        if self._checkpointer is not None:
            self._checkpointer.forget()
        self._checkpointer = None
        self._checkpointer_guard = threading.Lock()
        for _, conn in self._conns.values():
            _close_inherited(conn)
        self._conns = {}
        self._conns_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._local = threading.local()

    def close(self) -> None:
        """Close this process's connections.  Idempotent; the store is unusable after."""
        self._closed = True
        with self._checkpointer_guard:
            checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:
            checkpointer.stop()
        with self._conns_lock:
            conns = [conn for _, conn in self._conns.values()]
            self._conns = {}
        for conn in conns:
            # Best effort: the database stays consistent whether or not a close succeeds.
            with suppress(sqlite3.Error), _sqlite:
                conn.close()
        _live_stores.discard(self)

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        """Translate SQLite errors into the project's error tree, naming the operation."""
        try:
            yield
        except PercolatorError:
            raise
        except sqlite3.Error as exc:
            if _is_busy(exc):
                raise StoreUnavailableError(
                    f"embedded store {self.path!r}: {op} gave up after waiting "
                    f"{self._busy_timeout_s:g}s for the database lock (another process holds "
                    f"it): {exc}; nothing was written"
                ) from exc
            raise StoreError(f"embedded store {self.path!r}: {op} failed: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on a clean exit, else rolled back."""
        conn = self._conn()
        lock = _write_lock(self._db_path)
        clock = time.perf_counter
        asked = clock()
        # Threads of this process queue here, in order, and never meet SQLite's busy handler
        # (which sleeps in growing steps: 1, 2, 5, 10 ... ms) among themselves; only another
        # process's writer can make BEGIN IMMEDIATE wait.
        with lock, _sqlite:
            got = clock()
            try:
                # Waiting for another process's lock is left to SQLite's busy handler:
                # measured here, it gives better throughput under contention than a loop of
                # short sleeps, which wakes every waiter to compete for the CPU.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    _rollback(conn)
                    raise
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
            finally:
                self.write_lock.record(got - asked, clock() - got)
        self._logged()

    def _logged(self) -> None:
        """A write transaction committed to the log: have it copied into the database."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            with self._checkpointer_guard:
                if self._closed:
                    return
                checkpointer = self._checkpointer
                if checkpointer is None:
                    checkpointer = self._checkpointer = _Checkpointer(self, self._db_path)
        checkpointer.nudge()

    def _grouped(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` (one write call) in a write group: see :class:`_WriteGroups`."""
        return _write_group(self._db_path).run(self, work)

    def _run_group(self, group: list[_WriteRequest]) -> None:
        """One ``BEGIN IMMEDIATE`` transaction running every request of ``group``, each
        inside a savepoint so that a failing call undoes only its own statements (a request
        alone in its group needs none)."""
        with self._write() as conn:
            if len(group) == 1:
                # Alone in its transaction: if it fails, the whole transaction rolls back,
                # which is what its savepoint would do, two statements cheaper.
                group[0].result = group[0].work(conn)
                return
            for request in group:
                conn.execute("SAVEPOINT call")
                try:
                    request.result = request.work(conn)
                except Exception as exc:
                    conn.execute("ROLLBACK TO call")
                    request.error = exc
                conn.execute("RELEASE call")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every statement inside sees the same snapshot."""
        # This thread's connection is taken outside the gate: opening it may wait for the
        # store's connection lock, and nothing inside the gate may wait for another thread.
        conn = self._conn()
        with _sqlite:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                _rollback(conn)  # nothing to commit: ending the read is enough

    def _count(self, op: str) -> None:
        with self._stats_lock:
            self.stats.count(op)

    @staticmethod
    def _table(conn: sqlite3.Connection, name: str) -> tuple[int, Mapping[str, FamilySpec]]:
        found = conn.execute("SELECT id, families FROM tables WHERE name = ?", (name,)).fetchone()
        if found is None:
            raise TableNotFoundError(name)
        return int(found[0]), _decode_families(found[1])

    # ------------------------------------------------------------------ admin

    def create_table(self, name: str, families: Sequence[FamilySpec]) -> None:
        check_table_name(name)
        check_family_specs(families)
        self._count("create_table")
        with self._errors(f"create_table({name!r})"), self._write() as conn:
            if conn.execute("SELECT 1 FROM tables WHERE name = ?", (name,)).fetchone():
                raise TableExistsError(name)
            (tid,) = conn.execute("SELECT value FROM meta WHERE key = 'next_table_id'").fetchone()
            conn.execute("UPDATE meta SET value = ? WHERE key = 'next_table_id'", (tid + 1,))
            conn.execute(
                "INSERT INTO tables (name, id, families) VALUES (?, ?, ?)",
                (name, tid, _encode_families(families)),
            )

    def drop_table(self, name: str) -> None:
        check_table_name(name)
        self._count("drop_table")
        with self._errors(f"drop_table({name!r})"), self._write() as conn:
            tid, _ = self._table(conn, name)
            conn.execute("DELETE FROM cells WHERE tid = ?", (tid,))
            conn.execute("DELETE FROM delete_masks WHERE tid = ?", (tid,))
            conn.execute("DELETE FROM tables WHERE name = ?", (name,))
        self._tables.pop(name, None)

    def list_tables(self) -> list[str]:
        self._count("list_tables")
        with self._errors("list_tables"):
            conn = self._conn()
            with _sqlite:
                return sorted(r[0] for r in conn.execute("SELECT name FROM tables"))

    def table_families(self, name: str) -> list[FamilySpec]:
        check_table_name(name)
        self._count("table_families")
        with self._errors(f"table_families({name!r})"):
            conn = self._conn()
            with _sqlite:
                _, families = self._table(conn, name)
            return list(families.values())

    # ------------------------------------------------------------------ reads

    def read_rows(
        self,
        table: str,
        rows: Sequence[bytes],
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> dict[bytes, RowCells]:
        """A read of explicit cells that fits one statement (the common read: a
        transaction's cells, the oracle record) is that one statement, outside any explicit
        transaction: SQLite runs it in a read transaction of its own, so it is a snapshot,
        and it checks in the same statement that the table it read is still the one cached
        in :attr:`_tables` (see :data:`_TABLE_STILL_SQL`).  Anything else, and a table not
        cached or dropped since, is read in an explicit read transaction."""
        check_table_name(table)
        self._count("read_rows")
        upper = MAX_BEFORE if before is None else before
        return self._run_plan(
            f"read_rows({table!r})",
            table,
            lambda known: _ReadPlan(
                known, rows, columns, families, upper, min_version, max_versions
            ),
        )

    def read_cells(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        *,
        before: int | None = None,
    ) -> dict[bytes, RowCells]:
        """Exactly the cells named, each seeking its newest version below ``before``, as
        :meth:`read_rows` reads explicit columns (one statement when they fit one)."""
        check_table_name(table)
        rows, columns = split_cells(cells)
        if not rows:
            return {}
        self._count("read_rows")
        upper = MAX_BEFORE if before is None else before
        return self._run_plan(
            f"read_cells({table!r})",
            table,
            lambda known: _ReadPlan(known, rows, columns, None, upper, 0, 1, cells=cells),
        )

    def _run_plan(
        self,
        op: str,
        table: str,
        make_plan: Callable[[tuple[int, Mapping[str, FamilySpec]]], _ReadPlan],
    ) -> dict[bytes, RowCells]:
        """Run the plan ``make_plan`` builds (and checks) for ``table``'s (id, families):
        see :meth:`read_rows`.  ``op`` names the call in errors."""
        with self._errors(op):
            known = self._tables.get(table)
            plan: _ReadPlan | None = None
            if known is not None:
                # Arguments refused by the families of a table dropped since are checked
                # again below, against the table of that name now.
                with suppress(InvalidArgumentError):
                    plan = make_plan(known)
                if plan is not None and plan.single_statement:
                    conn = self._conn()
                    with _sqlite:
                        found = plan.run_checked(conn, table)
                    if found is not None:
                        return found
                    self._tables.pop(table, None)  # dropped (perhaps created again) since
            with self._read() as conn:
                known = self._table(conn, table)
                self._tables[table] = known
                if plan is None or plan.tid != known[0]:  # else checked against this table
                    plan = make_plan(known)
                return plan.run(conn)

    def scan(
        self, table: str, family: str, options: ScanOptions | None = None
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        check_table_name(table)
        opts = options if options is not None else ScanOptions()
        check_scan_options(opts)
        # Check the table and family now, not at the first next(): a bad scan should fail
        # where it is written.
        with self._errors(f"scan({table!r}, {family!r})"):
            conn = self._conn()
            with _sqlite:
                _, table_families = self._table(conn, table)
            check_family_name(family, table_families)
        return self._scan(table, family, opts)

    def _scan(
        self, table: str, family: str, opts: ScanOptions
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        upper = MAX_BEFORE if opts.before is None else opts.before
        qualifiers = None if opts.qualifiers is None else sorted(set(opts.qualifiers))
        remaining = opts.limit
        after: bytes | None = None  # last row returned: the next batch starts above it
        while remaining is None or remaining > 0:
            want = opts.batch_size if remaining is None else min(opts.batch_size, remaining)
            self._count("scan")
            batch: list[tuple[bytes, dict[bytes, Version]]] = []
            exhausted = True
            # A batch is read whole before anything is yielded, so no statement or read
            # transaction stays open while the caller works (perhaps writing meanwhile).
            with self._errors(f"scan({table!r}, {family!r})"), self._read() as conn:
                tid, table_families = self._table(conn, table)
                check_family_name(family, table_families)
                where = ["tid = ?", "family = ?"]
                params: list[object] = [tid, family]
                if after is None:
                    where.append("row >= ?")
                    params.append(opts.start)
                else:
                    where.append("row > ?")
                    params.append(after)
                if opts.stop is not None:
                    where.append("row < ?")
                    params.append(opts.stop)
                if qualifiers is not None:
                    where.append(f"qualifier IN ({_marks(len(qualifiers))})")
                    params.extend(qualifiers)
                where.append("version < ?")
                params.append(upper)
                if opts.value_ranges is not None:
                    # Filtered per version before max() picks the newest, as HBase does.
                    where.append(_value_ranges_sql(opts.value_ranges, params))
                sql = (
                    "SELECT row, qualifier, max(version), value FROM cells"
                    f" WHERE {' AND '.join(where)}"
                    " GROUP BY row, qualifier ORDER BY row, qualifier"
                )
                cursor = conn.execute(sql, params)
                try:
                    current: dict[bytes, Version] | None = None
                    for row, qualifier, version, value in cursor:
                        if current is None or row != batch[-1][0]:
                            if len(batch) == want:
                                exhausted = False
                                break
                            current = {}
                            batch.append((row, current))
                        current[qualifier] = (version, value)
                finally:
                    cursor.close()
            yield from batch
            if batch:
                after = batch[-1][0]
            if remaining is not None:
                remaining -= len(batch)
            if exhausted:
                return

    # ------------------------------------------------------------------ writes

    def put(self, table: str, puts: Sequence[Put]) -> None:
        check_table_name(table)
        check_sequence(puts, "puts")
        self._count("put")

        with self._errors(f"put({table!r})"):
            self._grouped(lambda conn: self._put(conn, table, puts))

    def _put(self, conn: sqlite3.Connection, table: str, puts: Sequence[Put]) -> None:
        """The puts of one call inside the caller's write transaction, all checked before
        any is written."""
        tid, families = self._table(conn, table)
        for put in puts:
            check_put(put, families)
        _write_rows(conn, _put_rows_sql, _put_rows(tid, puts))
        self._prune(conn, tid, families, _put_cells(puts))

    @staticmethod
    def _prune(
        conn: sqlite3.Connection,
        tid: int,
        families: Mapping[str, FamilySpec],
        cells: Iterable[tuple[str, bytes, bytes]],
    ) -> None:
        """Drop versions beyond each family's ``max_versions`` in the cells just written."""
        limited = {
            (tid, family, row, qualifier, families[family].max_versions)
            for family, row, qualifier in cells
            if families[family].max_versions < UNLIMITED_VERSIONS
        }
        if limited:
            conn.executemany(_PRUNE_SQL, limited)

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        check_table_name(table)
        item = CompareAndSet(row, family, qualifier, expected, new)
        check_compare_and_set(item, None)
        self._count("compare_and_set")
        with self._errors(f"compare_and_set({table!r}, {row!r})"):
            return self._grouped(lambda conn: self._compare_and_set_batch(conn, table, [item])[0])

    def compare_and_set_many(
        self, table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        """One write call: the puts, then every compare-and-set, in the same SQLite
        transaction, in order.  A bad item or put (unknown family) undoes the whole call
        before it returns."""
        check_table_name(table)
        check_compare_and_sets(items, None, conditional_puts=True)
        for put in check_sequence(puts, "puts"):
            check_put(put, None)  # the families are checked against the table's in `work`
        with self._stats_lock:
            self.stats.count("compare_and_set_many")
            self.stats.count("compare_and_set", len(items))

        batchable = _batchable(items, puts)  # decided before queueing: less under the mutex

        def work(conn: sqlite3.Connection) -> list[bool]:
            if batchable:
                return self._compare_and_set_batch(conn, table, items, puts)
            if puts:
                self._put(conn, table, puts)
            return [self._compare_and_set_batch(conn, table, [item])[0] for item in items]

        with self._errors(f"compare_and_set_many({table!r}, {len(items)} cells)"):
            return self._grouped(work) if items or puts else []

    def _compare_and_set_batch(
        self,
        conn: sqlite3.Connection,
        table: str,
        items: Sequence[CompareAndSet],
        puts: Sequence[Put] = (),
    ) -> list[bool]:
        """The ``puts``, then the compare-and-sets ``items`` (distinct cells that no put
        writes, see :func:`_batchable`, or a single item), inside the caller's write
        transaction, with the outcome of running them one after the other, in a fixed
        number of statements: one per 64 cells reading the table, the store clock and each
        cell's newest version; the clock moved; one per 64 rows writing the puts, the new
        versions and their ``then_put``; the replaced versions dropped.  One clock reading
        stamps every item."""
        tid, families, last, newest = self._cas_read(conn, table, items)
        for item in items:
            check_family_name(item.family, families)
            for put in item.then_put:
                check_family_name(put.family, families)
        for put in puts:
            check_put(put, families)
        applied = [
            cas_matches(newest[i][1] if i in newest else None, item.expected)
            for i, item in enumerate(items)
        ]
        rows = _put_rows(tid, puts)
        # Cells to trim to their family's max_versions once everything is written.
        written = _put_cells(puts)
        replaced: list[tuple[int, str, bytes, bytes, int]] = []
        if any(applied):
            clock = _advance_clock(conn, last)
            then_put: list[Put] = []
            for i, item in enumerate(items):
                if not applied[i]:
                    continue
                newest_version = newest[i][0] if i in newest else None
                stamp = _stamp(clock, newest_version)
                rows.append((tid, item.family, item.row, item.qualifier, stamp, item.new))
                if newest_version is not None and stamp != newest_version:
                    # A new version next to older ones.  In a family of one version the
                    # older one simply goes (a stamp above an existing version is never
                    # under a delete mask: the mask would have removed that version).
                    if families[item.family].max_versions == 1:
                        replaced.append((tid, item.family, item.row, item.qualifier, stamp))
                    else:
                        written.append((item.family, item.row, item.qualifier))
                then_put += item.then_put  # in the same transaction: atomic with the item
            rows += _put_rows(tid, then_put)
            written += _put_cells(then_put)
        _write_rows(conn, _put_rows_sql, rows)
        _write_rows(conn, _below_rows_sql, replaced)
        self._prune(conn, tid, families, written)
        return applied

    @staticmethod
    def _cas_read(
        conn: sqlite3.Connection, table: str, items: Sequence[CompareAndSet]
    ) -> tuple[int, Mapping[str, FamilySpec], int | str, dict[int, tuple[int, bytes]]]:
        """What compare-and-sets of ``items`` read (:func:`_cas_read_sql`): the table's id
        and families, the store clock, and the newest ``(version, value)`` of each item's
        cell by index (absent for a cell without versions).  ``items`` is not empty."""
        newest: dict[int, tuple[int, bytes]] = {}
        if len(items) == 1:
            item = items[0]
            one = conn.execute(
                _CAS_READ_ONE_SQL, (table, item.family, item.row, item.qualifier)
            ).fetchone()
            if one is None:
                raise TableNotFoundError(table)
            tid, encoded, last, version, value = one
            if version is not None:
                newest[0] = (version, value)
            return int(tid), _decode_families(encoded), last, newest
        found: tuple[Any, ...] | None = None
        for offset in range(0, len(items), _CELLS_PER_STATEMENT):
            chunk = items[offset : offset + _CELLS_PER_STATEMENT]
            params: list[object] = []
            for item in chunk:
                params += (item.family, item.row, item.qualifier)
            if found is None:
                sql, params = _cas_read_sql(len(chunk), "name"), [*params, table]
            else:
                sql, params = _cas_read_sql(len(chunk), "id"), [*params, found[0]]
            found = conn.execute(sql, params).fetchone()
            if found is None:
                raise TableNotFoundError(table)
            for i, version, value in json.loads(found[3]):
                newest[offset + i] = (version, bytes.fromhex(value))
        assert found is not None
        tid, encoded, last, _ = found
        return int(tid), _decode_families(encoded), last, newest

    def delete_versions(self, table: str, deletes: Sequence[Delete]) -> None:
        check_table_name(table)
        items = check_sequence(deletes, "deletes")
        self._count("delete_versions")

        def work(conn: sqlite3.Connection) -> None:
            tid, families = self._table(conn, table)
            for delete in items:
                check_delete(delete, families)
            checked: Sequence[Delete] = deletes
            params = [(tid, d.family, d.row, d.qualifier, d.at_or_below) for d in checked]
            _write_rows(conn, _at_or_below_rows_sql, params)
            _write_rows(conn, _mask_rows_sql, params)

        with self._errors(f"delete_versions({table!r})"):
            self._grouped(work)

    def compact_deletes(self, table: str) -> int:
        check_table_name(table)
        self._count("compact_deletes")
        with self._errors(f"compact_deletes({table!r})"), self._write() as conn:
            tid, _ = self._table(conn, table)
            dropped: int = conn.execute("DELETE FROM delete_masks WHERE tid = ?", (tid,)).rowcount
            return dropped


def _batchable(items: Sequence[CompareAndSet], puts: Sequence[Put]) -> bool:
    """Whether :meth:`EmbeddedStore._compare_and_set_batch` gives the same outcome as the
    puts and then the items one after the other: items of distinct cells, none of which a
    put or an item's ``then_put`` writes (every cell is read before any is written)."""
    if not items:
        return False
    cells = {(item.family, item.row, item.qualifier) for item in items}
    if len(cells) < len(items):
        return False
    if any((put.family, put.row, put.qualifier) in cells for put in puts):
        return False
    return not any(
        (put.family, put.row, put.qualifier) in cells for item in items for put in item.then_put
    )


class _ReadPlan:
    """The statements of one :meth:`EmbeddedStore.read_rows` call, checked against the
    table's families: explicit cells, up to :data:`_CELLS_PER_STATEMENT` per statement
    (each seeks its cell's newest version directly), and whole families, up to
    :data:`_ROWS_PER_STATEMENT` rows per statement."""

    def __init__(
        self,
        table: tuple[int, Mapping[str, FamilySpec]],
        rows: Sequence[bytes],
        columns: Sequence[Column] | None,
        families: Sequence[str] | None,
        upper: int,
        min_version: int,
        max_versions: int,
        *,
        cells: Sequence[tuple[bytes, Column]] | None = None,
    ) -> None:
        """``cells`` (:meth:`EmbeddedStore.read_cells`): read exactly these, not every
        column of every row (``rows`` and ``columns`` are then their distinct rows and
        columns, for the checks)."""
        self.tid, table_families = table
        check_read_args(rows, columns, families, upper, min_version, max_versions, table_families)
        self.rows = list(dict.fromkeys(rows))
        if cells is not None:
            self.whole = []
            self.cells = list(dict.fromkeys((row, family, q) for row, (family, q) in cells))
        else:
            selection = selection_by_family(columns, families, table_families)
            # check_read_args allows whole families only with max_versions=1
            self.whole = [family for family, qualifiers in selection if qualifiers is None]
            columns_read = [
                (family, qualifier)
                for family, qualifiers in selection
                for qualifier in qualifiers or ()
            ]
            self.cells = [(row, family, q) for row in self.rows for family, q in columns_read]
        self.upper = upper
        self.min_version = min_version
        self.limit = min(max_versions, UNLIMITED_VERSIONS)  # no cell keeps more versions

    @property
    def single_statement(self) -> bool:
        """Explicit cells only, few enough for one statement."""
        return not self.whole and 0 < len(self.cells) <= _CELLS_PER_STATEMENT

    def run(self, conn: sqlite3.Connection) -> dict[bytes, RowCells]:
        """Every statement, on ``conn`` (inside the caller's read transaction if more than
        one)."""
        result: dict[bytes, RowCells] = {}
        if self.whole:
            for row, family, qualifier, version, value in self._read_families(conn):
                result.setdefault(row, {})[(family, qualifier)] = [(version, value)]
        for chunk in _chunks(self.cells, _CELLS_PER_STATEMENT):
            sql, params = self._cells_statement(chunk)
            self._add_cells(result, chunk, conn.execute(sql, params))
        return result

    def run_checked(self, conn: sqlite3.Connection, table: str) -> dict[bytes, RowCells] | None:
        """The one statement (see :attr:`single_statement`), run on its own; None if
        ``table`` no longer has the id this plan was made for (dropped since)."""
        sql, params = self._cells_statement(self.cells)
        cursor = conn.execute(_TABLE_STILL_SQL + sql, [self.tid, table, *params])
        found = cursor.fetchall()
        cells = [row for row in found if row[0] != -1]
        if len(cells) == len(found):
            return None
        result: dict[bytes, RowCells] = {}
        self._add_cells(result, self.cells, cells)
        return result

    def _cells_statement(
        self, chunk: Sequence[tuple[bytes, str, bytes]]
    ) -> tuple[str, list[object]]:
        params: list[object] = []
        for row, family, qualifier in chunk:
            params += (self.tid, family, row, qualifier, self.upper, self.min_version, self.limit)
        return _versions_sql(len(chunk)), params

    @staticmethod
    def _add_cells(
        result: dict[bytes, RowCells],
        chunk: Sequence[tuple[bytes, str, bytes]],
        found_rows: Iterable[tuple[int, int, bytes]],
    ) -> None:
        found: dict[int, list[Version]] = {}
        for index, version, value in found_rows:
            found.setdefault(index, []).append((version, value))
        for index, versions in found.items():
            row, family, qualifier = chunk[index]
            # Newest first (each part is ordered; sorting again costs nothing and does not
            # rely on how SQLite orders a compound select).
            versions.sort(reverse=True)
            result.setdefault(row, {})[(family, qualifier)] = versions

    def _read_families(
        self, conn: sqlite3.Connection
    ) -> Iterator[tuple[bytes, str, bytes, int, bytes]]:
        """The newest version in range of every cell of whole families of the rows.

        ``max()`` with bare columns: SQLite takes ``value`` from the row holding the maximum.
        This visits every version below ``upper`` of the cells read (explicit columns, in
        contrast, seek their newest version directly), so it costs more on cells with many
        versions that garbage collection has not trimmed yet.
        """
        for chunk in _chunks(self.rows, _ROWS_PER_STATEMENT):
            sql = (
                "SELECT row, family, qualifier, max(version), value FROM cells"
                f" WHERE tid = ? AND family IN ({_marks(len(self.whole))})"
                f" AND row IN ({_marks(len(chunk))}) AND version < ? AND version >= ?"
                " GROUP BY family, row, qualifier"
            )
            params = [self.tid, *self.whole, *chunk, self.upper, self.min_version]
            yield from conn.execute(sql, params)


class _WriteRequest:
    """One write call waiting for, or run by, a group leader."""

    __slots__ = ("done", "error", "lead", "result", "work")

    def __init__(self, work: Callable[[sqlite3.Connection], Any]) -> None:
        self.work = work
        # Set when the call may go on (its group committed, or it is to lead next).  Only
        # a call that queues behind a leader waits on it: one that leads at once has none.
        self.done: threading.Event | None = None
        self.lead = False
        self.result: Any = None
        self.error: BaseException | None = None


class _WriteGroups:
    """Group commit for the write calls of one process on one database.

    A call queues its work; the first caller finding no leader becomes the leader and runs
    everything queued so far in **one** SQLite transaction (each call in a savepoint of its
    own, so a failing call undoes only itself), then hands the leadership to the first call
    that queued meanwhile.  Every call still reads and writes as if alone: calls of a group
    run one after the other, in queue order, inside one write lock.  A call returns only
    after its group's COMMIT; if the transaction fails (the database lock not obtained, the
    COMMIT refused), every call of the group fails with that error and nothing of the group
    was written.  What a group saves is the hand-offs: threads of one process no longer take
    the write mutex and win the GIL back once per call, and SQLite commits once per group.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: list[_WriteRequest] = []
        self._leading = False

    def run(self, store: EmbeddedStore, work: Callable[[sqlite3.Connection], _T]) -> _T:
        request = _WriteRequest(work)
        asked = time.perf_counter()
        with self._mutex:
            if self._leading:
                request.done = threading.Event()
            else:
                self._leading = request.lead = True
            self._queue.append(request)
        if request.done is not None:  # queued behind a leader
            try:
                request.done.wait()
            except BaseException:
                # Interrupted while waiting (Ctrl-C): a call still queued is withdrawn
                # (nothing written); one handed the leadership must still lead, or every
                # later write of this process would wait for a leader forever.
                with self._mutex:
                    withdrawn = not request.lead and request in self._queue
                    if withdrawn:
                        self._queue.remove(request)
                if not withdrawn and request.lead:
                    self._lead(store)
                raise
            store.write_lock.record_group_wait(time.perf_counter() - asked)
        if request.lead:  # first in, or handed the leadership while waiting
            self._lead(store)
        if request.error is not None:
            raise request.error
        result: _T = request.result
        return result

    def _lead(self, store: EmbeddedStore) -> None:
        with self._mutex:
            group, self._queue = self._queue, []
        try:
            store._run_group(group)
        except BaseException as exc:
            for request in group:
                if request.error is None:
                    request.error = (
                        exc
                        if isinstance(exc, Exception)
                        else StoreUnavailableError(
                            f"embedded store {store.path!r}: a write was interrupted "
                            f"({type(exc).__name__}) while in flight: outcome unknown"
                        )
                    )
            # The leader's own call re-raises the interrupt itself.
            raise
        finally:
            with self._mutex:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    assert successor.done is not None  # it queued behind this leader
                    successor.done.set()
                else:
                    self._leading = False
            for request in group:
                if request.done is not None and not request.lead:
                    request.done.set()


class _Checkpointer:
    """Copies a database's write-ahead log into the database in a thread of its own.

    SQLite's writer copies the log itself once it holds ``wal_autocheckpoint`` pages, in the
    COMMIT that crossed the mark: a worker's write transaction then waits for a copy of
    a thousand pages and an fsync.  Here the committing thread only sets a flag
    (:meth:`nudge`); this thread wakes, lets :data:`_CHECKPOINT_INTERVAL_S` of writes pile up
    (a page written several times meanwhile is copied once) and runs a PASSIVE checkpoint
    on its own connection, which never blocks writers or readers.  SQLite runs it with the
    GIL released, so it proceeds on another core while the writer goes on.  Nothing here
    is needed for correctness: the log is durable as it is (crash recovery replays it), and
    should this thread fall behind, writers copy it themselves past
    :data:`_WRITER_CHECKPOINT_PAGES` pages.  One per store and process, started by the
    first write; :meth:`stop` ends it (closing the store does, and so does garbage
    collection of a store nobody closed)."""

    def __init__(self, store: EmbeddedStore, db_path: str) -> None:
        # Opened here, in the writer's thread: the store's file handles exist once its first
        # write returned, not at some later moment.
        # A short busy timeout: a checkpoint that would have to wait is simply tried again
        # at the next nudge, and closing the store never waits long for this thread.
        with _sqlite:
            self._conn = sqlite3.connect(
                _sqlite_uri(db_path, "rw"),
                uri=True,
                timeout=_CHECKPOINT_BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,  # used by the thread below only
            )
        self._db_path = db_path
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        #: checkpoints run (for tests and statistics)
        self.runs = 0
        self._thread = threading.Thread(
            target=self._loop, name="percolator-checkpointer", daemon=True
        )
        self._thread.start()
        weakref.finalize(store, self._ask_to_stop)

    def nudge(self) -> None:
        # Called after every write: setting an Event takes its lock and notifies, so skip
        # it when already set.  A set flag is cleared only before a checkpoint starts, and
        # our write committed before we looked, so that checkpoint copies it.
        if not self._dirty.is_set():
            self._dirty.set()

    def _ask_to_stop(self) -> None:
        self._stopping.set()
        self._dirty.set()

    def stop(self) -> None:
        """End the thread and wait for it (a checkpoint under way finishes first), for a
        few seconds at most: a thread still busy then closes its connection when done."""
        self._ask_to_stop()
        self._thread.join(timeout=_CHECKPOINT_STOP_WAIT_S)

    def forget(self) -> None:
        """In a forked child: the thread is the parent's; close its connection."""
        _close_inherited(self._conn)

    def _loop(self) -> None:
        try:
            while True:
                self._dirty.wait()
                if self._stopping.wait(_CHECKPOINT_INTERVAL_S):
                    return
                self._dirty.clear()  # writes from here on ask for the next checkpoint
                try:
                    with _sqlite:
                        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.runs += 1
                except sqlite3.Error as exc:  # the next nudge tries again
                    log.debug("embedded store %s: checkpoint failed: %s", self._db_path, exc)
        finally:
            with suppress(sqlite3.Error), _sqlite:
                self._conn.close()


class WriteLockStats:
    """Where writing threads of this process spend their time (read without locking:
    approximate while busy): ``waits`` write transactions, ``wait_s`` spent queueing for the
    process's write mutex, ``held_s`` spent holding it (SQLite's write lock included),
    ``group_wait_s`` spent by calls waiting for a write group's leader to run them (or to
    hand them the leadership)."""

    __slots__ = ("group_wait_s", "held_s", "wait_s", "waits")

    def __init__(self) -> None:
        self.waits = 0
        self.wait_s = 0.0
        self.held_s = 0.0
        self.group_wait_s = 0.0

    def record(self, waited_s: float, held_s: float) -> None:
        # Called with the write mutex released or about to be: += on floats under the GIL
        # may lose an update under a race, which only blurs a statistic.
        self.waits += 1
        self.wait_s += waited_s
        self.held_s += held_s

    def record_group_wait(self, waited_s: float) -> None:
        self.group_wait_s += waited_s

    def snapshot(self) -> dict[str, float]:
        return {
            "waits": self.waits,
            "wait_s": self.wait_s,
            "held_s": self.held_s,
            "group_wait_s": self.group_wait_s,
        }


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _rollback(conn: sqlite3.Connection) -> None:
    # Fails harmlessly when no transaction is open (BEGIN failed, or SQLite already rolled
    # back after an I/O error).
    with suppress(sqlite3.Error):
        conn.execute("ROLLBACK")


def _reopen(path: str, busy_timeout_s: float) -> EmbeddedStore:
    return EmbeddedStore(path, busy_timeout_s=busy_timeout_s)


def _value_ranges_sql(ranges: Sequence[tuple[bytes, bytes | None]], params: list[object]) -> str:
    """The SQL condition of :attr:`ScanOptions.value_ranges` (values are BLOBs, which
    SQLite compares as unsigned bytes), appending its parameters to ``params``."""
    terms = []
    for low, high in ranges:
        if high is None:
            terms.append("value >= ?")
            params.append(low)
        else:
            terms.append("(value >= ? AND value < ?)")
            params.extend([low, high])
    return "(" + (" OR ".join(terms) or "0") + ")"
