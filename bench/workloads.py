"""Every benchmark workload, written once.

A workload is a plain function: it takes a store or a client (and parameters), sets up
what it needs, and either does the work or returns an *operation* ``op(i)``, one call of
the thing measured, with ``i`` a fresh index per call.  The per-area benchmarks time
operations over threads (:func:`bench._common.run_timed`); the profiles
(:mod:`bench.profiling`) count their round trips and run them under cProfile.  Neither
re-implements an operation.

Raw store        :func:`raw_table`, :func:`raw_load`, :func:`raw_get_op`, :func:`raw_put_op`,
                 :func:`raw_batch_put_op`, :func:`raw_cas_op`, :func:`raw_rows_op`
Transactions     :func:`txn_table`, :func:`txn_load`, :func:`txn_reads`,
                 :func:`txn_read_full_op`, :func:`txn_write_op`, :func:`backfill_batch_op`
Oracle           :func:`oracle_ops` (per-RPC, coalescing and ranged timestamps)
Observers        :class:`LatencyObserver`, :func:`write_events`
Notify scan      :func:`scan_setup`, :func:`load_scan_rows`, :func:`scan_pass_op`
Incremental      :class:`ChangingCorpus` (the example pipeline, bench/example.py)
Lock cleanup     :func:`bench.lock_bench.run_trial` (it needs the holder process there)
Spark            :func:`bench.spark_bench.measure_load` and ``measure_incremental``
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from percolator.observers.api import Observer, register_observers

import percolator
from percolator.layout import DATA, LOCK, WRITE
from percolator.notifications import put_notifications
from percolator.protocol.cells import CellKey
from percolator.records import CommitInfo, Kind, LockCell, WriteRecord
from percolator.store import FamilySpec, Put, Store
from percolator.store.base import CompareAndSet, ScanOptions
from percolator.transaction import Transaction

if TYPE_CHECKING:
    from percolator.observers.worker import DrainReport

Op = Callable[[int], object]

# --------------------------------------------------------------------------- raw store

RAW_FAMILIES = [FamilySpec("d"), FamilySpec("l", max_versions=1, in_memory=True)]


@contextmanager
def raw_table(store: Store, prefix: str = "bench_raw") -> Iterator[str]:
    """A fresh raw table (families ``d`` and ``l``), dropped afterwards (also on failure)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    store.create_table(name, RAW_FAMILIES)
    try:
        yield name
    finally:
        store.drop_table(name)


def raw_row(i: int) -> bytes:
    return b"p%09d" % i


def raw_load(store: Store, table: str, count: int, value: bytes) -> None:
    """Rows ``raw_row(0..count)`` with one cell each, in batched puts (what a get reads)."""
    for start in range(0, count, 1000):
        store.put(
            table,
            [Put(raw_row(i), "d", b"q", 1, value) for i in range(start, min(count, start + 1000))],
        )


def raw_warmup(store: Store, table: str, calls: int, value: bytes) -> None:
    """``calls`` untimed puts, gets and compare-and-sets (connections, caches, a fresh
    JVM's compiler), and where the store has them, compare-and-sets that carry a put: on
    HBase those go to the Thrift-2 gateway, a JVM of its own that the other calls leave
    cold although the engine's locks and commits use it."""
    cas_put = raw_cas_put_op(store, table, value, b"w") if store.conditional_puts else None
    for i in range(calls):
        row = b"w%09d" % i
        store.put(table, [Put(row, "d", b"q", 1, value)])
        store.read_row(table, row, [("d", b"q")])
        store.compare_and_set(table, row, "l", b"x", None, value)
        if cas_put is not None:
            cas_put(i)


def raw_put_op(store: Store, table: str, value: bytes) -> Op:
    """One put of one cell into row ``raw_row(i)`` (one RPC)."""

    def put(i: int) -> None:
        store.put(table, [Put(raw_row(i), "d", b"q", 1, value)])

    return put


def raw_get_op(store: Store, table: str, rows: int) -> Op:
    """``read_row`` of one existing row among ``raw_row(0..rows)``, one column (one RPC).  A
    fixed stride visits every row once in an order unrelated to write order."""
    stride = _coprime_stride(rows)

    def get(i: int) -> None:
        row = raw_row(i * stride % rows)
        if not store.read_row(table, row, [("d", b"q")]):
            raise AssertionError(f"benchmark row {row!r} is missing")

    return get


def raw_batch_put_op(store: Store, table: str, cells: int, value: bytes) -> Op:
    """One put of ``cells`` cells, one per row, all at one version (one RPC)."""

    def put_batch(i: int) -> None:
        base = i * cells
        store.put(table, [Put(b"b%09d" % (base + j), "d", b"q", 1, value) for j in range(cells)])

    return put_batch


def raw_cas_op(store: Store, table: str, value: bytes) -> Op:
    """``compare_and_set`` of a fresh cell from absent to a value (one RPC; never
    contended, so it measures the primitive, not conflicts)."""

    def cas(i: int) -> None:
        if not store.compare_and_set(table, b"c%09d" % i, "l", b"x", None, value):
            raise AssertionError(f"uncontended compare-and-set #{i} failed")

    return cas


def raw_cas_put_op(store: Store, table: str, value: bytes, prefix: bytes = b"p") -> Op:
    """A compare-and-set of a fresh cell (row ``prefix`` + ``i``, column ``l:y``) from absent
    to a value, carrying a put of ``d:y`` in the same row (one atomic call, as a prewrite's
    lock carries its data; on HBase the Thrift-2 gateway's ``checkAndPut``).  Only for stores
    with ``conditional_puts``."""

    def cas_put(i: int) -> None:
        row = prefix + b"%09d" % i
        item = CompareAndSet(row, "l", b"y", None, value, (Put(row, "d", b"y", 1, value),))
        if store.compare_and_set_many(table, [item]) != [True]:
            raise AssertionError(f"uncontended compare-and-set with a put #{i} failed")

    return cas_put


def row_puts(row: bytes, a: bytes, b: bytes) -> list[Put]:
    """The raw cells of one loaded row of two values (what a backfill row becomes)."""
    return [Put(row, "d", b"a", 1, a), Put(row, "d", b"b", 1, b)]


def raw_rows_op(store: Store, table: str, batch: int, value: bytes) -> Op:
    """One blind put of ``batch`` rows of two values (a raw bulk load's round trip)."""

    def put_rows(i: int) -> None:
        puts: list[Put] = []
        for j in range(batch):
            puts += row_puts(b"row%06d-%05d" % (i, j), value, value)
        store.put(table, puts)

    return put_rows


def _coprime_stride(n: int) -> int:
    """A stride near ``0.618 * n`` sharing no factor with ``n`` (so ``i * stride % n``
    visits every index once)."""
    stride = max(1, int(n * 0.618))
    while math.gcd(stride, n) != 1:
        stride += 1
    return stride


# --------------------------------------------------------------------------- transactions


@contextmanager
def txn_table(client: percolator.Client, prefix: str = "bench_txn") -> Iterator[str]:
    """A fresh engine table, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    client.create_table(name)
    try:
        yield name
    finally:
        client.drop_table(name)


def txn_row(i: int) -> bytes:
    return b"r%09d" % i


def txn_load(client: percolator.Client, table: str, count: int, value: bytes) -> None:
    """Rows ``txn_row(0..count)`` with one committed cell each, 200 per transaction."""
    for start in range(0, count, 200):

        def load(txn: Transaction, lo: int = start) -> None:
            for i in range(lo, min(count, lo + 200)):
                txn.set(table, txn_row(i), "c", value)

        client.run(load)


@contextmanager
def txn_reads(client: percolator.Client, table: str, threads: int = 1) -> Iterator[Op]:
    """``txn.get`` of the existing cell of ``txn_row(i)`` inside an open transaction, one
    transaction per thread of :func:`bench._common.run_timed` (thread ``t`` takes the
    indexes ``i % threads == t``); the transactions are rolled back afterwards.  An
    uncontended read is one store round trip."""
    readers = [client.transaction() for _ in range(threads)]

    def read(i: int) -> None:
        if readers[i % threads].get(table, txn_row(i), "c") is None:
            raise AssertionError(f"row {txn_row(i)!r} not found")

    try:
        yield read
    finally:
        for reader in readers:
            reader.rollback()


def txn_read_full_op(client: percolator.Client, table: str) -> Op:
    """A whole read-only transaction: a start timestamp from the oracle, one get."""

    def read_full(i: int) -> None:
        with client.transaction() as txn:
            if txn.get(table, txn_row(i), "c") is None:
                raise AssertionError(f"row {txn_row(i)!r} not found")

    return read_full


def txn_write_op(client: percolator.Client, table: str, value: bytes, cells: int = 1) -> Op:
    """A transaction writing ``cells`` fresh cells in as many rows, start to commit.  The
    rows are named after ``cells`` too, so that operations of different sizes on one table
    all insert (none overwrites a cell another wrote)."""

    def write(i: int) -> None:
        with client.transaction() as txn:
            for j in range(cells):
                txn.set(table, b"w%d-%09d-%d" % (cells, i, j), "c", value)

    return write


def backfill_batch_op(
    client: percolator.Client, table: str, progress: str, batch: int, value: bytes
) -> Op:
    """A transaction shaped like one batch of spark_jobs/backfill.py: read the batch's
    progress marker, write both values of ``batch`` rows and the marker."""

    def fill(i: int) -> None:
        marker = b"job/batch/%09d" % i
        with client.transaction() as txn:
            if txn.get(progress, marker, "m") is not None:
                raise AssertionError(f"marker {marker!r} exists")
            for j in range(batch):
                row = b"row%06d-%05d" % (i, j)
                txn.set(table, row, "a", value)
                txn.set(table, row, "b", value)
            txn.set(progress, marker, "m", b'{"rows": %d}' % batch)

    return fill


# --------------------------------------------------------------------------- oracle


@dataclass
class OracleOps:
    """The three ways oracle_bench asks for timestamps, on one oracle server."""

    #: the coalescing client (``stats.fetches`` / ``stats.timestamps`` count its RPCs)
    client: Any
    #: ``Allocate(count=1)`` on a shared channel: one timestamp per RPC
    per_rpc: Op
    #: ``client.get_timestamp()``: concurrent callers coalesced into one RPC in flight
    batched: Op
    #: ``Allocate(count=range)``: many timestamps in one RPC
    ranged: Op


@contextmanager
def oracle_ops(oracle_url: str, range_size: int = 100) -> Iterator[OracleOps]:
    import grpc
    from percolator.oracle.addressing import parse_oracle_url
    from percolator.oracle.client import GrpcOracleClient
    from percolator.oracle.proto_gen import oracle_pb2, oracle_pb2_grpc

    addresses, tls, token, _ = parse_oracle_url(oracle_url)
    client = GrpcOracleClient(addresses, token=token, tls=tls, timeout_s=30)
    try:
        client.get_timestamp()  # retries until the server holds its lease
        if tls is False:
            channel = grpc.insecure_channel(addresses[0])
        else:
            roots = None if tls is True else Path(str(tls)).read_bytes()
            channel = grpc.secure_channel(addresses[0], grpc.ssl_channel_credentials(roots))
        stub = oracle_pb2_grpc.TimestampOracleStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        one = oracle_pb2.AllocateRequest(count=1)
        many = oracle_pb2.AllocateRequest(count=range_size)
        try:
            yield OracleOps(
                client=client,
                per_rpc=lambda _: stub.Allocate(one, timeout=30, metadata=metadata).first,
                batched=lambda _: client.get_timestamp(),
                ranged=lambda _: stub.Allocate(many, timeout=30, metadata=metadata).first,
            )
        finally:
            channel.close()
    finally:
        client.close()


# --------------------------------------------------------------------------- observers

EVENTS = "bench_events"
OUT = "bench_out"


class LatencyObserver(Observer):
    """Records, for each changed row, the commit timestamp it covered (one read, one
    write: a light observer whose latency is the engine's)."""

    name = "bench-latency"
    table = EVENTS
    columns = ("value",)

    def setup(self, client: percolator.Client) -> None:
        client.create_table(EVENTS)
        client.create_table(OUT)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        _, covers = txn.get_with_commit_ts(EVENTS, row, column)
        txn.set(OUT, row, "covers", str(covers).encode())


def latency_observer(client: percolator.Client) -> LatencyObserver:
    """A :class:`LatencyObserver` with its tables created and its column registered."""
    observer = LatencyObserver()
    observer.setup(client)
    register_observers(client, [observer])
    return observer


def write_events(client: percolator.Client, prefix: str, count: int) -> list[bytes]:
    """``count`` fresh rows of :data:`EVENTS` written, 50 per transaction (a backlog of
    notifications); returns the rows."""
    rows = [f"{prefix}-{i:07d}".encode() for i in range(count)]
    for start in range(0, count, 50):
        with client.transaction() as txn:
            for row in rows[start : start + 50]:
                txn.set(EVENTS, row, "value", b"x")
    return rows


# --------------------------------------------------------------------------- notify scan

SCAN_TABLE = "bench_scan"
KEY_SPACE = 1 << 40


def scan_setup(client: percolator.Client, dirty: int) -> None:
    """:data:`SCAN_TABLE` with ``dirty`` notifications spread over the key space."""
    client.create_table(SCAN_TABLE)
    rng = random.Random(3)
    # Notifications only (no observer watches the column: trigger would refuse it).
    keys = [
        CellKey(SCAN_TABLE, b"row-%010d" % rng.randrange(KEY_SPACE), "value") for _ in range(dirty)
    ]
    put_notifications(client.store, keys, client.oracle.get_timestamp())


def load_scan_rows(client: percolator.Client, start: int, stop: int) -> None:
    """Committed-looking rows ``start..stop`` (data, write record, lock cell) loaded
    straight into :data:`SCAN_TABLE`: table size without paying for two-phase commit."""
    start_ts = client.oracle.get_timestamp()
    commit_ts = client.oracle.get_timestamp()
    record = WriteRecord(Kind.PUT, start_ts).encode()
    lock = LockCell(last_commit=CommitInfo(commit_ts, start_ts, Kind.PUT)).encode()
    value = b"v" * 100
    batch: list[Put] = []
    for i in range(start, stop):
        # A fixed pseudo-random order over the key space, so the dirty rows and the loaded
        # rows interleave at every size.
        row = b"row-%010d" % ((i * 2654435761) % KEY_SPACE)
        batch.append(Put(row, DATA, b"value", start_ts, value))
        batch.append(Put(row, WRITE, b"value", commit_ts, record))
        batch.append(Put(row, LOCK, b"value", 1, lock))
        if len(batch) >= 3000:
            client.store.put(SCAN_TABLE, batch)
            batch = []
    if batch:
        client.store.put(SCAN_TABLE, batch)


def scan_pass_op(store: Store, family: str) -> Op:
    """One scan of ``family`` of :data:`SCAN_TABLE` (the notify family: one notification
    pass of the scanner; the lock family: what finding dirty cells would cost without it)."""

    def one_pass(_: int) -> None:
        for _row in store.scan(SCAN_TABLE, family, ScanOptions(batch_size=500)):
            pass

    return one_pass


# --------------------------------------------------------------------------- incremental


class ChangingCorpus:
    """A seeded corpus of the example pipeline, kept current through rounds of changes."""

    def __init__(self, documents: int, seed: int) -> None:
        from bench.example import corpus

        self.current = corpus.generate(documents, seed=seed)

    @staticmethod
    def setup(client: percolator.Client) -> None:
        """The pipeline's tables, and its observed columns registered."""
        from bench.example import pipeline

        pipeline.create_tables(client)
        register_observers(client, pipeline.observers())

    @staticmethod
    def observers() -> list[Observer]:
        from bench.example import pipeline

        return pipeline.observers()

    def write_all(self, client: percolator.Client) -> None:
        from bench.example import corpus

        corpus.write_documents(client, self.current)

    def write_jsonl(self, path: str) -> None:
        """The corpus as a backfill input (``url``, ``body``, ``links``)."""
        import json

        with open(path, "w", encoding="utf-8") as out:
            for doc in self.current:
                links = doc.links_value()
                record = {
                    "url": doc.url,
                    "body": doc.body,
                    "links": links.decode() if links else None,
                }
                out.write(json.dumps(record) + "\n")

    def change(self, client: percolator.Client, fraction: float, seed: int) -> int:
        """Change about ``fraction`` of the documents (written, nothing processed); returns
        how many changed."""
        from bench.example import corpus

        changes = corpus.mutate(self.current, fraction=fraction, seed=seed)
        self.current = corpus.apply_changes(self.current, changes)
        corpus.write_documents(client, changes)
        return len(changes)

    def process(self, client: percolator.Client) -> DrainReport:
        """Every notification processed to quiescence in this thread (the drain)."""
        from percolator.observers.worker import run_until_quiet

        return run_until_quiet(client, self.observers())

    def expected(self) -> Any:
        """The derived tables the reference computes from the current corpus."""
        from bench.example import corpus, reference

        return reference.compute(corpus.as_input(self.current))
