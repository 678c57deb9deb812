"""The client: the entry point users hold (``percolator.connect(...)``).

A client owns one store connection (pool), one oracle, one lock resolver with its outcome
cache, and one thread pool for parallel rollbacks.  It is thread-safe; transactions
are not (one thread per transaction).

A client may be used after ``os.fork`` (``multiprocessing``'s default on Linux), in the
parent and in the child alike: the child's copy is a client of its own, with a new id (its
readers are published under a record of their own), its own thread pool, and its own
connections to the store and the oracle (each store and oracle renews those itself; two
processes on one connection would read each other's replies).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from percolator import watermark
from percolator.bulkload import (
    TABLE_STATE_REFRESH_MS,
    check_droppable,
    check_usable,
    clear_state,
    fence_for_drop,
    restore_state,
)
from percolator.concurrency import renew_after_fork
from percolator.context import ClientOptions, EngineContext
from percolator.errors import (
    ConflictError,
    InvalidArgumentError,
    PercolatorError,
    TableExistsError,
    TableNotFoundError,
)
from percolator.layout import (
    TABLE_FAMILIES,
    check_table_name,
    ensure_meta_table,
    name_list,
)
from percolator.notifications import (
    OBSERVED_REFRESH_ENV as OBSERVED_REFRESH_ENV,  # re-exported: test fixtures import it here
)
from percolator.notifications import ObservedColumns, collect_unobserved, notified_cells_of
from percolator.protocol.gc import (
    GcReport,
    check_life_time_ms,
    forget_table_progress,
    lock_report,
    run_gc,
)
from percolator.protocol.resolve import LockResolver
from percolator.readers import ReaderRegistry, release_safe_point, reserve_safe_point
from percolator.retry import Backoff, retry_transaction
from percolator.store.base import Store
from percolator.store.url import open_store
from percolator.timestamps import TimestampOracle, describe
from percolator.timestamps.factory import open_oracle
from percolator.transaction import Snapshot, Transaction
from percolator.watermark import ObserverWatermark

log = logging.getLogger(__name__)

T = TypeVar("T")


class Client:
    """See :func:`percolator.connect`."""

    def __init__(
        self,
        store: Store,
        oracle: TimestampOracle,
        options: ClientOptions | None = None,
        *,
        owns_store: bool = True,
    ) -> None:
        self.options = options or ClientOptions()
        self.store = store
        self.oracle = oracle
        self._owns_store = owns_store
        ensure_meta_table(store)
        self.client_id = uuid.uuid4().hex
        self._readers = ReaderRegistry(
            store, self.client_id, safe_point_refresh_ms=self.options.safe_point_refresh_ms
        )
        self._ctx = EngineContext(
            store=store,
            oracle=oracle,
            resolver=LockResolver(store),
            executor=ThreadPoolExecutor(self.options.parallelism, thread_name_prefix="percolator"),
            options=self.options,
            readers=self._readers,
            check_table=self._check_table,
        )
        # table -> time.monotonic() at which the read that found it usable started
        # (trusted for TABLE_STATE_REFRESH_MS, percolator/bulkload.py "Clients re-check")
        self._tables: dict[str, float] = {}
        self._tables_lock = threading.Lock()
        self._closed = False
        self._init_observed()
        renew_after_fork(self)

    def _after_fork_in_child(self) -> None:
        """The child's copy becomes a client of its own (module docstring): a new id for
        its readers' record, a thread pool of its own (the parent's threads do not exist
        here), fresh locks."""
        if self._closed:
            return
        self.client_id = uuid.uuid4().hex
        self._readers.start_over(self.client_id)
        self._ctx.executor = ThreadPoolExecutor(
            self.options.parallelism, thread_name_prefix="percolator"
        )
        self._tables_lock = threading.Lock()

    # ---------------------------------------------------------------- tables

    def create_table(self, name: str) -> None:
        """Create a user table with the engine's families.  Idempotent.  Raises
        TableLoadingError for a table being bulk-loaded (checked again after the create: a
        load may have fenced the name just before, see percolator/bulkload.py)."""
        check_table_name(name)
        check_usable(self.store, name)
        try:
            self.store.create_table(name, TABLE_FAMILIES)
            # A new table under the name of a dropped one starts uncollected.
            forget_table_progress(self.store, name)
        except TableExistsError:
            families = {f.name for f in self.store.table_families(name)}
            expected = {f.name for f in TABLE_FAMILIES}
            if families != expected:
                raise InvalidArgumentError(
                    f"table {name!r} exists but is not an engine table "
                    f"(families {sorted(families)}, expected {sorted(expected)})"
                ) from None
        checked = time.monotonic()
        check_usable(self.store, name)
        with self._tables_lock:
            self._tables[name] = checked

    def drop_table(self, name: str) -> None:
        """Drop a user table.  Locks in *other* tables whose primary is in this one are
        resolved first (their transactions' fate is recorded there, and would be lost with
        it); if one of them is still alive, nothing is dropped and ConflictError says which.
        Not atomic with concurrent writers of the other tables: stop them first.

        A table a bulk load holds is dropped only once the load's lease has expired
        (BulkLoadError before: its writers may still be putting cells, which would land in
        the next table of that name).  The drop holds the name (state ``dropping``, from the
        exact state it checked) while it drops, so no load begins or takes over meanwhile
        (percolator/tablestate.py)."""
        check_table_name(name)
        check_droppable(self.store, name)  # early: before the work below
        for other in self.list_tables():
            if other == name:
                continue
            for raw in lock_report(self.store, other):
                lock = raw.lock_cell.lock
                if lock is None or lock.primary_table != name:
                    continue
                outcome = self._ctx.resolver.resolve(raw)
                if not outcome.final:
                    raise ConflictError(
                        f"cannot drop table {name!r}: a live transaction has its primary "
                        f"there and a lock on {raw.key}; retry when it finished",
                        table=raw.key.table,
                        row=raw.key.row,
                        column=raw.key.column,
                        conflict_ts=lock.start_ts,
                    )
        fence = fence_for_drop(self.store, name)  # checks again, on the state it replaces
        try:
            self.store.drop_table(name)
        except BaseException:
            restore_state(self.store, name, fence.dropping, fence.previous)
            raise
        forget_table_progress(self.store, name)
        clear_state(self.store, name, fence)  # an ordinary name again
        with self._tables_lock:
            self._tables.pop(name, None)

    def list_tables(self) -> list[str]:
        """The engine's tables in the store (:func:`percolator.layout.engine_tables`): other
        tables sharing the store are not listed, dropped or collected."""
        from percolator.layout import engine_tables

        return engine_tables(self.store)

    def _check_table(self, name: str, *, allow_loading: bool = False) -> None:
        """Raise at the call for an unknown or malformed table, or (TableLoadingError) one
        being bulk-loaded unless ``allow_loading``.  What it found is trusted for
        :data:`~percolator.bulkload.TABLE_STATE_REFRESH_MS` (no round trip meanwhile), then
        the table's state is read again: a bulk load waits that long after fencing a table
        before its cells can be read or its lock check made (percolator/bulkload.py,
        "Clients re-check").  The committer calls it again after its prewrite."""
        checked = self._tables.get(name)
        if checked is not None and (
            allow_loading or time.monotonic() - checked <= TABLE_STATE_REFRESH_MS / 1000
        ):
            return
        if checked is None:
            check_table_name(name)
            if not self.store.table_exists(name):
                raise TableNotFoundError(name)
            if allow_loading:
                return
        started = time.monotonic()  # before the read: the trust counts from here
        check_usable(self.store, name)
        with self._tables_lock:
            self._tables[name] = started

    # ---------------------------------------------------------------- transactions

    def transaction(self) -> Transaction:
        """Begin a transaction at a fresh ``start_ts``."""
        self._check_open()
        return Transaction(self._ctx, self.oracle.get_timestamp())

    def snapshot(self, read_ts: int | None = None) -> Snapshot:
        """A read-only snapshot at ``read_ts`` (default: a fresh timestamp).

        A given ``read_ts`` must be one the oracle has handed out (a ``commit_ts``, another
        snapshot's ``read_ts``): one above a fresh timestamp is refused
        (InvalidArgumentError), since transactions may still commit below it, and two reads
        there could see different data.  Checking it draws one timestamp."""
        self._check_open()
        if read_ts is None:
            return Snapshot(self._ctx, self.oracle.get_timestamp())
        if not isinstance(read_ts, int) or isinstance(read_ts, bool) or read_ts <= 0:
            raise InvalidArgumentError(f"read_ts must be a positive int, got {read_ts!r}")
        now_ts = self.oracle.get_timestamp()
        if read_ts > now_ts:
            raise InvalidArgumentError(
                f"read_ts {describe(read_ts)} is above every timestamp the oracle has handed "
                f"out ({describe(now_ts)}): transactions may still commit below it, so a "
                "snapshot there would not be one; use a timestamp the oracle gave (a "
                "commit_ts, a snapshot's read_ts)"
            )
        return Snapshot(self._ctx, read_ts)

    def run(
        self,
        fn: Callable[[Transaction], T],
        max_attempts: int = 10,
        *,
        backoff_ms: int = 5,
    ) -> T:
        """Run ``fn`` in a transaction and commit; on a retryable error re-run the **whole
        function** in a new transaction (never re-apply a buffered write set), after a
        jittered backoff from ``backoff_ms`` (doubling, at most 1 s), ``max_attempts`` times
        at most.  ``fn`` may commit the transaction itself; if it leaves it active, it is
        committed when ``fn`` returns (rolled back when ``fn`` raises).

        UndeterminedCommitError and non-retryable errors propagate at once (the rule of
        :func:`percolator.retry.retry_transaction`)."""
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be a positive int, got {max_attempts!r}")

        def on_retry(n: int, exc: PercolatorError) -> None:
            log.debug("attempt %d of %d failed (%s); retrying", n, max_attempts, exc)

        return retry_transaction(
            self.transaction,
            fn,
            attempts=max_attempts,
            backoff=Backoff(backoff_ms / 1000, 1.0),
            on_retry=on_retry,
        )

    def wait_for(
        self,
        ts: int | None = None,
        observers: Iterable[str] | None = None,
        *,
        timeout: float = 60.0,
    ) -> dict[str, ObserverWatermark]:
        """Return once the low watermark of every named observer (None: all registered) is
        above ``ts`` (None: a fresh timestamp): every change they watch committed before
        ``ts``, and what upstream observers derived from it, is processed.  Raises
        WatermarkTimeoutError naming what is still pending.  See percolator/watermark.py."""
        self._check_open()
        return watermark.wait_for(self.store, self.oracle, ts, observers, timeout=timeout)

    # ---------------------------------------------------------------- safe point

    def safe_point(self, *, refresh: bool = False) -> int:
        """The stored GC safe point (cached for ``safe_point_refresh_ms``)."""
        return self._readers.safe_point(refresh=refresh)

    def gc(
        self,
        *,
        life_time_ms: int = 600_000,
        tables: list[str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> GcReport:
        """Collect versions older than ``life_time_ms`` (see percolator/protocol/gc.py)."""
        check_life_time_ms(life_time_ms)  # before anything is read or drawn
        every = self.list_tables()
        # A table named twice is collected once.
        names = list(dict.fromkeys(name_list(tables, "tables"))) if tables is not None else every
        for name in names:
            # GC may pass over a table being loaded: it holds only the load's committed
            # cells, each the newest (and only) version GC would keep.
            self._check_table(name, allow_loading=True)
        with self._readers.collecting():  # its readers count from memory, not the record
            report = run_gc(
                self.store,
                self._ctx.resolver,
                names,
                all_tables=every,
                now_ts=self.oracle.get_timestamp(),
                life_time_ms=life_time_ms,
                progress=progress,
                own_oldest_reader=self._readers.min_active,
                own_row=self._readers.row,
                notified=notified_cells_of(self.store),
            )
        report.notifications_collected = collect_unobserved(self.store, names, report.bound)
        self.safe_point(refresh=True)
        return report

    def on_lock_met(self, listener: Callable[[float, str], None]) -> None:
        """Call ``listener(age_s, outcome)`` for every lock of another transaction that this
        client's reads, writes and GC meet: how long ago that transaction started, and what
        it was judged to be (``"alive"``: still running, waited for or conflicted with;
        ``"committed"`` / ``"rolled_back"``: resolved then).  Old locks met mean clients
        that died holding locks, or long transactions in everyone's way (the worker exports
        this as ``percolator_locks_met_age_seconds``).  The listener runs on the thread that
        met the lock and must be quick."""
        self._ctx.resolver.add_listener(lambda age_s, state: listener(age_s, state.name.lower()))

    # ---------------------------------------------------------------- live readers

    def min_active_start_ts(self) -> int | None:
        """The oldest ``start_ts`` among this client's live transactions and snapshots."""
        return self._readers.min_active()

    def publish_min_start_ts(self) -> None:
        """Publish this client's oldest live reader now (it is published on its own when
        the first reader registers and renewed while readers live: percolator/readers.py)."""
        self._readers.publish()

    def reserve_safe_point(self, name: str, ts: int, ttl_ms: int) -> None:
        """Keep GC's safe point at or below ``ts`` under ``name`` for ``ttl_ms`` (call again
        to renew): for long jobs whose readers live in several processes (exports,
        backfills).  ``percolator status`` lists reservations."""
        reserve_safe_point(self.store, name, ts, ttl_ms)

    def release_safe_point(self, name: str) -> None:
        """Drop the reservation ``name`` (idempotent)."""
        release_safe_point(self.store, name)

    # ---------------------------------------------------------------- observed columns
    #
    # Which (table, column) pairs leave notifications when written: a cache owned by
    # percolator/notifications.py (format, registry and refresh guarantee are there).

    def _init_observed(self) -> None:
        self._observed = ObservedColumns(self.store)
        self._ctx.is_observed = self._observed.is_observed

    def refresh_observed(self) -> frozenset[tuple[str, str]]:
        """Reload the observed set from the store now (one scan of the meta table) and
        return it.  Raises StoreUnavailableError if the store cannot be read; the cache is
        then left as it was (and is still stale, so the next commit tries again)."""
        return self._observed.refresh()

    def observed_columns(self) -> frozenset[tuple[str, str]]:
        """The observed ``(table, column)`` pairs, reloaded first if the cached set was
        loaded more than one refresh interval ago."""
        return self._observed.current()

    def observer_transaction(self) -> Transaction:
        """A transaction at a fresh timestamp that may also write the engine's reserved
        columns: the observer runs' (percolator.observers.runner), which write their acks
        (:func:`percolator.notifications.write_ack`) in the same transaction as the user
        code.  User code never needs one."""
        self._check_open()
        return Transaction(self._ctx, self.oracle.get_timestamp(), allow_reserved=True)

    # ---------------------------------------------------------------- lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise PercolatorError("the client is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._readers.close()
        self._ctx.executor.shutdown(wait=True)
        self._ctx.heartbeats.close()
        self.oracle.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    store_url: str | Store | None = None,
    oracle: str | TimestampOracle | None = None,
    **options: int,
) -> Client:
    """Open a client.

    ``store_url``: ``"memory:"``, ``"embedded:PATH"`` or ``"hbase://HOST:PORT"`` (default
    ``embedded:./percolator-data``), or an open :class:`Store`.
    ``oracle``: ``None`` for the in-process oracle persisted in the store,
    ``"grpc://HOST:PORT[,HOST:PORT...]"`` for the timestamp oracle service (or any other
    ``SCHEME://`` an installed oracle plugin provides, see
    :mod:`percolator.timestamps.factory`), or an object implementing
    :class:`TimestampOracle`, which is asked to check the store first
    (:meth:`TimestampOracle.attach_store`: a ``LocalOracle`` of another store, or an oracle
    client made for another store, is refused).
    ``options``: fields of :class:`ClientOptions` (``lock_ttl_ms``, ``lock_wait_ms``, ...).
    """
    known = sorted(ClientOptions.__dataclass_fields__)
    unknown = set(options) - set(known)
    if unknown:
        raise InvalidArgumentError(f"unknown option(s) {sorted(unknown)}; known: {known}")
    client_options = ClientOptions(**options)
    owns_store = not isinstance(store_url, Store)
    store = store_url if isinstance(store_url, Store) else open_store(store_url)
    try:
        if isinstance(oracle, TimestampOracle):
            # An object made elsewhere: it checks (and will bind) this store's timestamp
            # domain as a URL's oracle does (percolator/timestamps/domain.py).
            oracle.attach_store(store)
        else:
            ensure_meta_table(store)
        ts_oracle = open_oracle(oracle, store)
        return Client(store, ts_oracle, client_options, owns_store=owns_store)
    except BaseException:
        if owns_store:
            store.close()
        raise
