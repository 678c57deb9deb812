"""The client: the entry point users hold (``percolator.connect(...)``).

A client owns one store connection (pool), one oracle, one lock resolver with its outcome
cache, and one thread pool for parallel compare-and-sets.  It is thread-safe; transactions
are not (one thread per transaction).
"""

from __future__ import annotations

import logging
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from percolator.bulkload import check_usable, clear_state
from percolator.context import ClientOptions, EngineContext
from percolator.errors import (
    InvalidArgumentError,
    PercolatorError,
    SafePointError,
    TableExistsError,
    TableNotFoundError,
)
from percolator.layout import (
    META_FAMILY,
    META_TABLE,
    TABLE_FAMILIES,
    check_table_name,
    ensure_meta_table,
)
from percolator.notifications import (
    OBSERVED_REFRESH_ENV as OBSERVED_REFRESH_ENV,  # re-exported: test fixtures import it here
)
from percolator.notifications import ObservedColumns
from percolator.protocol.gc import CLIENTS_PREFIX, GcReport, read_safe_point, run_gc
from percolator.resolver import LockResolver
from percolator.store.base import Put, Store
from percolator.store.url import open_store
from percolator.timestamps import TimestampOracle, describe, now_ms
from percolator.timestamps.factory import open_oracle
from percolator.transaction import Snapshot, Transaction

log = logging.getLogger(__name__)

T = TypeVar("T")

_U64 = struct.Struct(">Q")
# A client publishes its oldest live transaction this often, valid for four periods.
PUBLISH_INTERVAL_S = 30.0


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
        self._ctx = EngineContext(
            store=store,
            oracle=oracle,
            resolver=LockResolver(store),
            executor=ThreadPoolExecutor(self.options.parallelism, thread_name_prefix="percolator"),
            options=self.options,
        )
        self._tables: set[str] = set()
        self._tables_lock = threading.Lock()
        self._safe_point = 0
        self._safe_point_loaded_at = -1e18
        self._active: dict[int, int] = {}  # start_ts -> count of live transactions
        self._active_lock = threading.Lock()
        self.client_id = uuid.uuid4().hex
        self._publisher: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._init_observed()

    # ---------------------------------------------------------------- tables

    def create_table(self, name: str) -> None:
        """Create a user table with the engine's families.  Idempotent.  Raises
        TableLoadingError for a table being bulk-loaded (checked again after the create: a
        load may have fenced the name just before, see percolator/bulkload.py)."""
        check_table_name(name)
        check_usable(self.store, name)
        try:
            self.store.create_table(name, TABLE_FAMILIES)
        except TableExistsError:
            families = {f.name for f in self.store.table_families(name)}
            expected = {f.name for f in TABLE_FAMILIES}
            if families != expected:
                raise InvalidArgumentError(
                    f"table {name!r} exists but is not an engine table "
                    f"(families {sorted(families)}, expected {sorted(expected)})"
                ) from None
        check_usable(self.store, name)
        with self._tables_lock:
            self._tables.add(name)

    def drop_table(self, name: str) -> None:
        check_table_name(name)
        self.store.drop_table(name)
        clear_state(self.store, name)  # a dropped table is no longer being loaded
        with self._tables_lock:
            self._tables.discard(name)

    def list_tables(self) -> list[str]:
        from percolator.layout import SYSTEM_TABLE_PREFIX

        return [t for t in self.store.list_tables() if not t.startswith(SYSTEM_TABLE_PREFIX)]

    def _check_table(self, name: str, *, allow_loading: bool = False) -> None:
        """Raise at the call for an unknown or malformed table, or (TableLoadingError) one
        being bulk-loaded unless ``allow_loading`` (cached: no round trip for a table this
        client already knows; a usable table never becomes loading, see
        percolator/bulkload.py)."""
        if name in self._tables:
            return
        check_table_name(name)
        if not self.store.table_exists(name):
            raise TableNotFoundError(name)
        if allow_loading:
            return
        check_usable(self.store, name)
        with self._tables_lock:
            self._tables.add(name)

    # ---------------------------------------------------------------- transactions

    def transaction(self) -> Transaction:
        """Begin a transaction at a fresh ``start_ts``."""
        self._check_open()
        return Transaction(self, self.oracle.get_timestamp())

    def snapshot(self, read_ts: int | None = None) -> Snapshot:
        """A read-only snapshot at ``read_ts`` (default: a fresh timestamp)."""
        self._check_open()
        return Snapshot(self, read_ts if read_ts is not None else self.oracle.get_timestamp())

    def run(
        self,
        fn: Callable[[Transaction], T],
        max_attempts: int = 10,
        *,
        backoff_ms: int = 5,
    ) -> T:
        """Run ``fn`` in a transaction and commit; on a retryable error re-run the **whole
        function** in a new transaction (never re-apply a buffered write set).

        UndeterminedCommitError and non-retryable errors propagate at once."""
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be a positive int, got {max_attempts!r}")
        delay = backoff_ms / 1000
        for attempt in range(1, max_attempts + 1):
            txn = self.transaction()
            try:
                result = fn(txn)
                if txn.status.value == "active":
                    txn.commit()
                return result
            except PercolatorError as exc:
                if txn.status.value == "active":
                    txn.rollback()
                if not exc.retryable or attempt == max_attempts:
                    raise
                log.debug("attempt %d of %d failed (%s); retrying", attempt, max_attempts, exc)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
            except BaseException:
                if txn.status.value == "active":
                    txn.rollback()
                raise
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- safe point

    def safe_point(self, *, refresh: bool = False) -> int:
        if refresh or (
            time.monotonic() * 1000 - self._safe_point_loaded_at
            > self.options.safe_point_refresh_ms
        ):
            self._safe_point = read_safe_point(self.store)[0]
            self._safe_point_loaded_at = time.monotonic() * 1000
        return self._safe_point

    def _check_read_ts(self, read_ts: int) -> None:
        safe_point = self.safe_point()
        if read_ts < safe_point:
            raise SafePointError(
                f"cannot read at {describe(read_ts)}: it is below the garbage-collection "
                f"safe point {describe(safe_point)}, whose older versions may be gone"
            )

    def gc(
        self,
        *,
        life_time_ms: int = 600_000,
        tables: list[str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> GcReport:
        """Collect versions older than ``life_time_ms`` (see percolator/protocol/gc.py)."""
        if not isinstance(life_time_ms, int) or life_time_ms < 0:
            raise InvalidArgumentError(
                f"life_time_ms must be a non-negative int, got {life_time_ms!r}"
            )
        names = tables if tables is not None else self.list_tables()
        for name in names:
            # GC may pass over a table being loaded: it holds only the load's committed
            # cells, each the newest (and only) version GC would keep.
            self._check_table(name, allow_loading=True)
        report = run_gc(
            self.store,
            self._ctx.resolver,
            names,
            now_ts=self.oracle.get_timestamp(),
            life_time_ms=life_time_ms,
            progress=progress,
        )
        self.safe_point(refresh=True)
        return report

    # ---------------------------------------------------------------- live transactions

    def _register_active(self, start_ts: int) -> None:
        with self._active_lock:
            self._active[start_ts] = self._active.get(start_ts, 0) + 1
            if self._publisher is None:
                self._publisher = threading.Thread(
                    target=self._publish_loop, daemon=True, name="percolator-min-start-ts"
                )
                self._publisher.start()

    def _publish_loop(self) -> None:
        # Only transactions older than GC's life time need this; publishing every
        # PUBLISH_INTERVAL_S while any transaction is live is cheap and simple.
        while not self._stop.wait(PUBLISH_INTERVAL_S):
            if self.min_active_start_ts() is None:
                continue
            try:
                self.publish_min_start_ts(int(PUBLISH_INTERVAL_S * 4000))
            except PercolatorError as exc:
                log.warning("could not publish the oldest live transaction: %s", exc)

    def _unregister_active(self, start_ts: int) -> None:
        with self._active_lock:
            count = self._active.get(start_ts, 0) - 1
            if count <= 0:
                self._active.pop(start_ts, None)
            else:
                self._active[start_ts] = count

    def min_active_start_ts(self) -> int | None:
        with self._active_lock:
            return min(self._active) if self._active else None

    def publish_min_start_ts(self, ttl_ms: int = 120_000) -> None:
        """Tell garbage collection the oldest live transaction of this client (so the safe
        point stays below it) until ``ttl_ms`` from now."""
        oldest = self.min_active_start_ts()
        row = CLIENTS_PREFIX + self.client_id.encode()
        value = _U64.pack(oldest or 0) + _U64.pack(now_ms() + ttl_ms)
        self.store.put(META_TABLE, [Put(row, META_FAMILY, b"min_start_ts", 1, value)])

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

    def _reserved_transaction(self) -> Transaction:
        """A transaction that may write reserved columns: only for
        :func:`percolator.notifications.observer_transaction` (observer acks)."""
        self._check_open()
        return Transaction(self, self.oracle.get_timestamp(), allow_reserved=True)

    # ---------------------------------------------------------------- lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise PercolatorError("the client is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._ctx.executor.shutdown(wait=True)
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
    :class:`TimestampOracle`.
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
        if not isinstance(oracle, TimestampOracle):
            ensure_meta_table(store)
        ts_oracle = open_oracle(oracle, store)
        return Client(store, ts_oracle, client_options, owns_store=owns_store)
    except BaseException:
        if owns_store:
            store.close()
        raise
