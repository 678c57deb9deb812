"""A client used on both sides of ``os.fork`` (``multiprocessing``'s default on Linux).

Two processes on one Thrift connection read each other's replies; a child's copies of the
parent's gRPC channels and threads are dead; a child sharing its parent's reader record
overwrites the parent's oldest reader.  Each test forks with objects opened before the fork,
works in both processes, and checks the results from the store."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import percolator
from percolator.layout import DATA, TABLE_FAMILIES
from percolator.readers import CLIENTS_PREFIX, scan_publications
from percolator.store import open_store
from percolator.store.base import Put, Store

ROWS = 20


def start_child(work: Callable[[], str]) -> tuple[int, int]:
    """Fork; the child runs ``work`` and ends with ``os._exit`` (it never returns into the
    test run).  Returns the child's pid and the pipe its result comes back on."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        try:
            text, code = work(), 0
        except BaseException as exc:  # reported to the parent, which fails the test
            text, code = f"child failed: {type(exc).__name__}: {exc}", 1
        os.write(write_end, text.encode())
        os._exit(code)
    os.close(write_end)
    return pid, read_end


def child_result(pid: int, read_end: int, timeout_s: float = 60) -> str:
    """The result of a child of :func:`start_child` (the test fails if the child failed or
    hung)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child hung for {timeout_s:g} s")
        time.sleep(0.01)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def increment(client: percolator.Client, max_attempts: int) -> None:
    """One read-modify-write of the test counter ``t/counter/v``, retried on conflicts."""

    def one(txn: percolator.Transaction) -> None:
        value = txn.get("t", b"counter", "v")
        txn.set("t", b"counter", "v", str(int(value or b"0") + 1).encode())

    client.run(one, max_attempts=max_attempts)


def in_child(work: Callable[[], str]) -> str:
    return child_result(*start_child(work))


def wrong_reads(store: Store, seconds: float) -> str:
    """Read the test rows over and over for ``seconds``: how many answers were wrong."""
    wrong = 0
    deadline = time.monotonic() + seconds
    reads = 0
    while time.monotonic() < deadline:
        i = reads % ROWS
        found = store.read_row("t", b"r%02d" % i, columns=[(DATA, b"v")])
        if found.get((DATA, b"v"), [(0, b"")])[0][1] != b"value %02d" % i:
            wrong += 1
        reads += 1
    return f"{wrong} wrong of {reads}"


def local_address(conn: Any) -> object:
    """The local address of a pooled Thrift connection's socket."""
    sock = conn._socket()
    assert sock is not None
    return sock.getsockname()


@pytest.mark.hbase
def test_parent_and_child_never_share_a_thrift_connection(hbase_store_url: str) -> None:
    store = open_store(hbase_store_url)
    try:
        store.create_table("t", TABLE_FAMILIES)
        store.put("t", [Put(b"r%02d" % i, DATA, b"v", 1, b"value %02d" % i) for i in range(ROWS)])
        wrong_reads(store, 0.2)  # a connection pooled before the fork, idle at the fork
        pool = store._pool  # type: ignore[attr-defined]
        parents = {local_address(conn) for conn in pool._idle}
        assert parents

        def reads_in_child() -> str:
            # Deterministic: the child's connection is one of its own.  (Sharing one is
            # caught by the reads too, when the two processes' requests interleave.)
            conn = pool.acquire()
            try:
                assert local_address(conn) not in parents, "the child got its parent's socket"
            finally:
                pool.release(conn)
            result = wrong_reads(store, 2.0)
            store.close()  # the child's own connections; the parent's are only forgotten
            gc.collect()
            return result

        forked = start_child(reads_in_child)
        in_parent = wrong_reads(store, 2.0)  # at the same time as the child's
        child_reads = child_result(*forked)
        assert child_reads.startswith("0 wrong"), child_reads
        assert in_parent.startswith("0 wrong"), in_parent
        # The parent's pooled connections survived the child's close and exit: the same
        # sockets still serve (none was shut down under it).
        idle = list(pool._idle)
        assert {local_address(conn) for conn in idle} & parents
        assert all(conn.looks_alive() for conn in idle)
        assert wrong_reads(store, 0.2).startswith("0 wrong")
    finally:
        store.drop_table("t")
        store.close()


def test_a_forked_child_commits_and_publishes_its_readers_apart(shared_store_url: str) -> None:
    with percolator.connect(shared_store_url) as client:
        client.create_table("t")
        client.create_table("u")
        client.run(lambda txn: txn.set("t", b"r", "v", b"parent"))
        parent_reader = client.snapshot()
        assert parent_reader.get("t", b"r", "v") == b"parent"

        def child() -> str:
            # A transaction over two tables (parallel calls on HBase need the client's
            # thread pool) and a reader of the child's own.
            def write(txn: percolator.Transaction) -> None:
                txn.set("t", b"r", "v", b"child")
                txn.set("u", b"r", "v", b"x")

            client.run(write)
            with client.snapshot() as reader:
                assert reader.get("t", b"r", "v") == b"child"
                records = published(client)
                assert client.client_id in records, records
                # Its record covers its readers, the inherited one included.
                assert 0 < records[client.client_id] <= reader.read_ts
            return client.client_id

        child_id = in_child(child)
        assert child_id != client.client_id
        assert client.snapshot().get("u", b"r", "v") == b"x"
        # The parent's record still covers the parent's reader.
        assert 0 < published(client)[client.client_id] <= parent_reader.read_ts
        parent_reader.close()


def published(client: percolator.Client) -> dict[str, int]:
    """Every client's published oldest reader, by client id."""
    return {
        p.row[len(CLIENTS_PREFIX) :].decode(): p.min_start_ts
        for p in scan_publications(client.store)
    }


def test_a_forked_child_draws_timestamps_from_the_oracle_service(
    tmp_path: os.PathLike[str],
) -> None:
    from tests.oracle.procs import OracleProcess

    store_url = f"embedded:{tmp_path}/store"
    server = OracleProcess(store_url, Path(tmp_path) / "oracle.log").start()
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        client = stack.enter_context(
            percolator.connect(store_url, oracle=f"grpc://{server.address}")
        )
        before = client.oracle.get_timestamp()  # the channel and its stream are open

        def child() -> str:
            started = time.monotonic()
            ts = client.oracle.get_timestamp()
            return f"{ts} {time.monotonic() - started:.3f}"

        ts, took = in_child(child).split()
        assert int(ts) > before
        # The client's timeout is 10 s: a child waiting on its parent's dead stream took that.
        assert float(took) < 2.0, took
        assert client.oracle.get_timestamp() > int(ts)


def test_parent_and_child_increment_one_counter_without_losing_an_update(
    shared_store_url: str,
) -> None:
    """The whole client on both sides of a fork, racing: every read-modify-write of one
    cell by either process is in the final value (snapshot isolation across the two)."""
    increments = 60

    def bump() -> None:
        for _ in range(increments):
            increment(client, max_attempts=200)

    with percolator.connect(shared_store_url) as client:
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"counter", "v", b"0"))

        def in_the_child() -> str:
            bump()
            return "done"

        forked = start_child(in_the_child)
        bump()
        assert child_result(*forked) == "done"
        assert client.snapshot().get("t", b"counter", "v") == str(2 * increments).encode()


def test_a_fork_while_a_parent_thread_holds_the_clients_locks(embedded_url: str) -> None:
    """A thread of the parent inside a critical section at the moment of the fork: the
    child's client must not wait for a lock that nobody in the child will release."""
    with percolator.connect(embedded_url) as client:
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"r", "v", b"x"))
        held = [client._ctx.resolver._lock, client._observed._lock]  # type: ignore[attr-defined]
        taken = threading.Event()
        release = threading.Event()

        def hold() -> None:
            for lock in held:
                lock.acquire()
            taken.set()
            release.wait()
            for lock in held:
                lock.release()

        holder = threading.Thread(target=hold)
        holder.start()
        taken.wait()
        try:

            def in_the_child() -> str:
                client._observed.refresh()  # type: ignore[attr-defined]
                client._ctx.resolver.cached_status(1)  # type: ignore[attr-defined]
                client.run(lambda txn: txn.set("t", b"r", "v", b"child"))
                return "done"

            assert child_result(*start_child(in_the_child), timeout_s=20) == "done"
        finally:
            release.set()
            holder.join()
        assert client.snapshot().get("t", b"r", "v") == b"child"


def test_forks_while_parent_threads_are_inside_store_calls(shared_store_url: str) -> None:
    """Parent threads keep committing while the main thread forks, so each fork catches
    some of them inside a store call (a pooled connection lent out, a write group led, a
    statistics lock held).  Every child must still commit on its own, and no increment of
    either side may be lost."""
    threads, children, per_child = 3, 4, 15

    with percolator.connect(shared_store_url) as client:
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"counter", "v", b"0"))
        stop = threading.Event()
        done = [0] * threads

        def busy(i: int) -> None:
            while not stop.is_set():
                increment(client, max_attempts=500)
                done[i] += 1

        workers = [threading.Thread(target=busy, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        try:

            def in_the_child() -> str:
                for _ in range(per_child):
                    increment(client, max_attempts=500)
                return "done"

            results = []
            for _ in range(children):
                time.sleep(0.05)
                results.append(child_result(*start_child(in_the_child), timeout_s=60))
        finally:
            stop.set()
            for worker in workers:
                worker.join()
        assert results == ["done"] * children
        assert sum(done) > 0
        expected = children * per_child + sum(done)
        assert client.snapshot().get("t", b"counter", "v") == str(expected).encode()


def test_a_fork_waits_for_the_write_transaction_under_way(tmp_path: os.PathLike[str]) -> None:
    """SQLite keeps a file's locks per process: a child forked inside a parent thread's write
    transaction would inherit a write lock that nobody in the child releases.  The fork
    waits for the transaction instead, and the child then writes at once."""
    store = open_store(f"embedded:{tmp_path}/store")
    try:
        store.create_table("t", TABLE_FAMILIES)
        inside, finish = threading.Event(), threading.Event()

        def write_slowly() -> None:
            with store._write() as conn:  # type: ignore[attr-defined]
                conn.execute("SELECT 1")
                inside.set()
                finish.wait()

        writer = threading.Thread(target=write_slowly)
        writer.start()
        inside.wait()
        forked: list[tuple[int, int]] = []

        def child_put() -> str:
            store.put("t", [Put(b"r", DATA, b"v", 1, b"child")])
            return "done"

        forker = threading.Thread(target=lambda: forked.append(start_child(child_put)))
        forker.start()
        forker.join(0.3)
        assert forker.is_alive(), "forked inside another thread's write transaction"
        finish.set()
        writer.join()
        forker.join(10)
        assert child_result(*forked[0], timeout_s=20) == "done"
        found = store.read_row("t", b"r", columns=[(DATA, b"v")])
        assert found[(DATA, b"v")][0][1] == b"child"
    finally:
        store.close()


def test_forks_while_parent_threads_are_inside_sqlite(tmp_path: os.PathLike[str]) -> None:
    """A thread inside SQLite's C code may hold one of SQLite's own mutexes; a child forked
    then inherits it locked and its first SQLite call waits for ever.  Threads draw
    timestamps (reads and compare-and-sets of the oracle's record) while the main thread
    forks; every child must draw one of its own."""
    with percolator.connect(f"embedded:{tmp_path}/store") as client:
        stop = threading.Event()

        def draw() -> None:
            while not stop.is_set():
                client.oracle.get_timestamp()

        drawers = [threading.Thread(target=draw) for _ in range(3)]
        for drawer in drawers:
            drawer.start()
        try:
            for _ in range(120):
                time.sleep(0.01)
                forked = start_child(lambda: str(client.oracle.get_timestamp()))
                assert int(child_result(*forked, timeout_s=20)) > 0
        finally:
            stop.set()
            for drawer in drawers:
                drawer.join()


_ORPHAN = """
import os, sys, time
import percolator

role, url, out = sys.argv[1], sys.argv[2], sys.argv[3]


def bump(client):
    def one(txn):
        value = txn.get("t", b"counter", "v")
        txn.set("t", b"counter", "v", str(int(value or b"0") + 1).encode())

    client.run(one, max_attempts=1000)


def bump_for(client, seconds):
    count, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        bump(client)
        count += 1
    with open(out, "w") as done:
        done.write(str(count))


if role == "setup":
    with percolator.connect(url) as client:
        client.create_table("t")
        client.run(lambda txn: txn.set("t", b"counter", "v", b"0"))
elif role == "parent":
    client = percolator.connect(url)
    for _ in range(20):
        bump(client)
    if os.fork() == 0:
        time.sleep(0.5)  # the parent has exited; the newcomer opens the store meanwhile
        bump_for(client, 4)
        os._exit(0)
    os._exit(0)  # the parent leaves at once, its store open
else:  # a newcomer, opening the store once the parent is gone
    time.sleep(0.2)
    with percolator.connect(url) as client:
        bump_for(client, 3)
"""


def test_a_forked_child_outliving_its_parent_shares_the_store_safely(
    tmp_path: os.PathLike[str],
) -> None:
    """A child keeps using the store its parent opened after the parent exited, while a
    newcomer process opens the store and works beside it: no committed increment of either
    may be lost.  (A child that kept its inherited SQLite connections open held none of the
    file locks a process must hold, and the newcomer rebuilt the shared index under it:
    about 100 of 6,000 increments were lost in one run of two.)"""
    script = Path(tmp_path) / "orphan.py"
    script.write_text(_ORPHAN)

    def run(role: str, url: str, out: Path) -> None:
        cmd = [sys.executable, str(script), role, url, str(out)]
        subprocess.run(cmd, check=True, timeout=60)

    for attempt in range(2):
        url = f"embedded:{tmp_path}/store{attempt}"
        counts = [Path(tmp_path) / f"{name}{attempt}" for name in ("child", "newcomer")]
        run("setup", url, counts[0])
        run("parent", url, counts[0])
        run("newcomer", url, counts[1])
        for _ in range(200):  # the child writes its count when done
            if counts[0].exists() and counts[0].read_text():
                break
            time.sleep(0.05)
        child, newcomer = (int(path.read_text()) for path in counts)
        with percolator.connect(url) as client:
            total = client.snapshot().get("t", b"counter", "v")
        expected = 20 + child + newcomer
        assert child > 0 and newcomer > 0
        assert total == str(expected).encode(), f"lost {expected - int(total or 0)} increments"
