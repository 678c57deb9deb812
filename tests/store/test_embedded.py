"""Tests of the embedded store beyond the shared contract: durability, crashes, several
processes, forks, and what happens on a bad directory."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from percolator.errors import (
    InvalidArgumentError,
    StoreError,
    StoreNotFoundError,
    StoreUnavailableError,
    TableNotFoundError,
)
from percolator.store import CompareAndSet, Delete, FamilySpec, Put, ScanOptions, Store, open_store
from percolator.store.embedded import DB_FILE, EmbeddedStore
from tests.store._store_worker import batch_rows

REPO_ROOT = Path(__file__).resolve().parents[2]
FAMILIES = [FamilySpec("d"), FamilySpec("l", max_versions=1)]


def start_worker(url: str, *args: str) -> subprocess.Popen[str]:
    """Start a batches/chain/counter worker and release it (see ``_store_worker``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.store._store_worker", *args[:1], url, *args[1:]],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return proc


def rows_by_batch(store: Store, table: str) -> dict[int, dict[bytes, dict[bytes, bytes]]]:
    """batch number -> row -> qualifier -> value, from a scan of family d."""
    out: dict[int, dict[bytes, dict[bytes, bytes]]] = {}
    for row, cells in store.scan(table, "d", ScanOptions(batch_size=500)):
        batch = int(row[1:7])
        out.setdefault(batch, {})[row] = {q: v for q, (_, v) in cells.items()}
    return out


def assert_rows_whole(
    batches: dict[int, dict[bytes, dict[bytes, bytes]]], rows: int, cells: int
) -> None:
    for batch, found in batches.items():
        for row, row_cells in found.items():
            assert len(row_cells) == cells, f"row {row!r} of batch {batch} is partial"
            assert set(row_cells.values()) == {b"%d" % batch}


# --------------------------------------------------------------------------- durability


def test_everything_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with EmbeddedStore(str(path)) as store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"r", "d", b"q", v, b"v%d" % v) for v in (1, 2, 3)])
        store.delete_versions("t", [Delete(b"r", "d", b"q", 1), Delete(b"m", "d", b"q", 50)])
        assert store.compare_and_set("t", b"r", "l", b"q", None, b"lock")
        [(cas_version, _)] = store.read_row("t", b"r", [("l", b"q")])[("l", b"q")]
    with EmbeddedStore(str(path)) as store:
        assert store.list_tables() == ["t"]
        assert store.table_families("t") == FAMILIES
        assert store.read_row("t", b"r", [("d", b"q")], max_versions=9) == {
            ("d", b"q"): [(3, b"v3"), (2, b"v2")]
        }
        # The delete mask is durable too.
        store.put("t", [Put(b"m", "d", b"q", 40, b"masked")])
        assert store.read_row("t", b"m") == {}
        # The store clock never goes back, also across a reopen.
        assert store.compare_and_set("t", b"r", "l", b"q", b"lock", b"lock2")
        [(version, value)] = store.read_row("t", b"r", [("l", b"q")])[("l", b"q")]
        assert value == b"lock2" and version >= cas_version


@pytest.mark.parametrize("name", ["a?x=1", "h#frag", "p%20q r"])
def test_a_path_with_uri_characters_holds_its_own_store(tmp_path: Path, name: str) -> None:
    """SQLite opens the store by a ``file:`` URI: unescaped, ``?`` or ``#`` would end the
    path there and put the data in another file (two such paths would share it)."""
    path = tmp_path / name
    with EmbeddedStore(str(path)) as store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"r", "d", b"q", 1, b"v")])
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    with EmbeddedStore(str(path)) as store:
        assert store.read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}


def test_writes_of_a_finished_process_are_visible(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    with open_store(url) as store:
        store.create_table("t", FAMILIES)
    proc = start_worker(url, "batches", "t", "10", "3", "4")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    with open_store(url) as store:
        batches = rows_by_batch(store, "t")
    assert sorted(batches) == [0, 1, 2, 3]
    assert all(len(rows) == 10 for rows in batches.values())
    assert_rows_whole(batches, 10, 3)


def test_sigkill_mid_batch_leaves_whole_rows(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    rows, cells = 300, 4
    rng = random.Random(1234)
    for attempt in range(4):
        table = f"t{attempt}"
        with open_store(url) as store:
            store.create_table(table, FAMILIES)
        proc = start_worker(url, "batches", table, str(rows), str(cells), "0")
        assert proc.stdout is not None
        acknowledged = [int(proc.stdout.readline()) for _ in range(2)]
        # Kill at a random moment: often while the next batch is being written.
        time.sleep(rng.uniform(0, 0.05))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        with EmbeddedStore(str(tmp_path / "store")) as store:
            batches = rows_by_batch(store, table)
        # Every acknowledged batch is there, whole; every row of any batch is whole; and
        # (stronger than the contract, but what this store promises) each put call is
        # all-or-nothing.
        assert set(acknowledged) <= set(batches)
        assert_rows_whole(batches, rows, cells)
        for batch, found in batches.items():
            assert sorted(found) == batch_rows(batch, rows), f"batch {batch} is partial"


def test_two_processes_write_and_read_at_once(tmp_path: Path) -> None:
    url = f"embedded:{tmp_path / 'store'}"
    rows, cells, count = 40, 3, 40
    with open_store(url) as store:
        store.create_table("t", FAMILIES)
        store.create_table("mine", FAMILIES)
        proc = start_worker(url, "batches", "t", str(rows), str(cells), str(count))
        # While the other process writes, this one reads and writes too.
        reads = 0
        while proc.poll() is None or reads == 0:
            assert_rows_whole(rows_by_batch(store, "t"), rows, cells)
            store.put("mine", [Put(b"r%06d" % reads, "d", b"q", 1, b"x")])
            expected = None if reads == 0 else b"%d" % (reads - 1)
            assert store.compare_and_set("mine", b"c", "l", b"q", expected, b"%d" % reads)
            reads += 1
        assert proc.wait(timeout=60) == 0
        batches = rows_by_batch(store, "t")
        assert sorted(batches) == list(range(count))
        assert_rows_whole(batches, rows, cells)
        assert len(list(store.scan("mine", "d"))) == reads


def _child_uses_inherited_store(store: EmbeddedStore) -> None:
    inherited = store._checkpointer
    store.put("t", [Put(b"from-child", "d", b"q", 1, b"%d" % os.getpid())])
    assert store.compare_and_set("t", b"c", "l", b"q", b"parent", b"child")
    # The parent's checkpointer thread does not exist here: the child's writes started
    # one of its own, which closing the store ends.
    assert store._checkpointer is not None and store._checkpointer is not inherited
    assert [t.name for t in threading.enumerate()].count("percolator-checkpointer") == 1
    store.close()
    assert [t.name for t in threading.enumerate()].count("percolator-checkpointer") == 0


def test_a_forked_child_opens_its_own_connections(tmp_path: Path) -> None:
    with EmbeddedStore(str(tmp_path / "store")) as store:
        store.create_table("t", FAMILIES)
        # The parent's connection exists before the fork.
        assert store.compare_and_set("t", b"c", "l", b"q", None, b"parent")
        child = multiprocessing.get_context("fork").Process(
            target=_child_uses_inherited_store, args=(store,)
        )
        child.start()
        child.join(timeout=60)
        assert child.exitcode == 0 and child.pid is not None
        # The parent's own connection still works after the child used and closed its own.
        assert store.read_row("t", b"from-child") == {("d", b"q"): [(1, b"%d" % child.pid)]}
        assert store.compare_and_set("t", b"c", "l", b"q", b"child", b"parent again")


def checkpointer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "percolator-checkpointer"]


def test_a_thread_of_its_own_copies_the_log_into_the_database(tmp_path: Path) -> None:
    """A write returns once it is in the write-ahead log; the store's checkpointer thread
    then copies the log into the database file, not the writers (whose own threshold is far
    above what this writes).  Closing the store ends the thread."""
    threads_before = len(checkpointer_threads())
    store = EmbeddedStore(str(tmp_path / "store"))
    db_file = tmp_path / "store" / DB_FILE
    store.create_table("t", FAMILIES)
    assert store._conn().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 20_000
    size_before = db_file.stat().st_size
    store.put("t", [Put(b"r%04d" % i, "d", b"q", 1, os.urandom(1000)) for i in range(3000)])
    deadline = time.monotonic() + 10
    while db_file.stat().st_size < size_before + 3_000_000:
        assert time.monotonic() < deadline, "the log was not copied into the database"
        time.sleep(0.02)
    assert store._checkpointer is not None and store._checkpointer.runs >= 1
    assert len(checkpointer_threads()) == threads_before + 1
    store.close()
    assert len(checkpointer_threads()) == threads_before


def test_a_store_nobody_closed_ends_its_checkpointer_when_collected(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path / "store"))
    store.create_table("t", FAMILIES)
    assert store._checkpointer is not None
    thread = store._checkpointer._thread
    assert thread.is_alive()
    del store
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_concurrent_first_open_of_a_new_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "store"
    code = (
        "import sys\n"
        "from percolator.store import FamilySpec, open_store\n"
        "s = open_store('embedded:' + sys.argv[1])\n"
        "s.create_table('t' + sys.argv[2], [FamilySpec('d')])\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path), str(i)], cwd=REPO_ROOT)
        for i in range(4)
    ]
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0, 0, 0]
    with EmbeddedStore(str(path)) as store:
        assert store.list_tables() == ["t0", "t1", "t2", "t3"]


def test_pickled_store_opens_the_same_directory(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path / "store"), busy_timeout_s=7)
    with store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"r", "d", b"q", 1, b"v")])
        with pickle.loads(pickle.dumps(store)) as copy:
            assert isinstance(copy, EmbeddedStore)
            assert copy.path == store.path
            assert copy.read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}


# --------------------------------------------------------------------------- locks and threads


def test_a_held_write_lock_times_out_as_unavailable(tmp_path: Path) -> None:
    with EmbeddedStore(str(tmp_path / "store"), busy_timeout_s=0.2) as store:
        store.create_table("t", FAMILIES)
        blocker = sqlite3.connect(tmp_path / "store" / DB_FILE, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailableError, match="database lock"):
                store.put("t", [Put(b"r", "d", b"q", 1, b"v")])
            with pytest.raises(StoreUnavailableError):
                store.compare_and_set("t", b"r", "l", b"q", None, b"v")
            # Readers are not blocked by a writer, and neither is opening the store.
            assert store.read_row("t", b"r") == {}
            with EmbeddedStore(str(tmp_path / "store"), busy_timeout_s=0.2) as again:
                assert again.list_tables() == ["t"]
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        store.put("t", [Put(b"r", "d", b"q", 1, b"v")])
        assert store.read_row("t", b"r") == {("d", b"q"): [(1, b"v")]}


def test_threads_of_one_process_queue_instead_of_sleeping_on_busy(tmp_path: Path) -> None:
    # A busy timeout of 1 ms: a thread that met SQLite's write lock held by a sibling thread
    # would give up (StoreUnavailableError) or sleep in the busy handler's 1, 2, 5 ... ms
    # steps.  Threads of one process queue on the process's own write mutex instead.
    with EmbeddedStore(str(tmp_path / "store"), busy_timeout_s=0.001) as store:
        store.create_table("t", FAMILIES)
        before = store.write_lock.snapshot()
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def write(t: int) -> None:
            barrier.wait()
            try:
                for i in range(150):
                    row = f"r{t}-{i}".encode()
                    store.put("t", [Put(row, "d", b"q", 1, b"v" * 100)])
                    assert store.compare_and_set("t", row, "l", b"q", None, b"locked")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        stats = store.write_lock.snapshot()
        transactions = stats["waits"] - before["waits"]
        # Every write went through the mutex, in groups: concurrent calls share a transaction.
        assert 0 < transactions < 8 * 150 * 2
        assert stats["group_wait_s"] > before["group_wait_s"], "the threads did contend"
        for t in range(8):
            for i in range(150):
                cells = store.read_row("t", f"r{t}-{i}".encode())
                assert cells[("l", b"q")][0][1] == b"locked"
                assert cells[("d", b"q")] == [(1, b"v" * 100)]


def test_a_failing_call_undoes_only_itself_in_its_write_group(tmp_path: Path) -> None:
    """Calls of several threads run in one SQLite transaction (group commit); each call is
    still all or nothing on its own: a bad call fails alone, the others are written."""
    with EmbeddedStore(str(tmp_path / "store")) as store:
        store.create_table("t", FAMILIES)
        outcomes: dict[int, object] = {}
        barrier = threading.Barrier(6)

        def write(t: int) -> None:
            barrier.wait()
            for i in range(100):
                row = f"r{t}-{i}".encode()
                try:
                    if t % 2:
                        # A batch whose last put names an unknown family: nothing of it.
                        store.put("t", [Put(row, "d", b"q", 1, b"v"), Put(row, "x", b"q", 1, b"v")])
                    else:
                        store.put("t", [Put(row, "d", b"q", 1, b"v")])
                        assert store.compare_and_set("t", row, "l", b"q", None, b"locked")
                        assert not store.compare_and_set("t", row, "l", b"q", None, b"again")
                except Exception as exc:
                    outcomes[t * 1000 + i] = exc

        threads = [threading.Thread(target=write, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert store.write_lock.waits < 6 * 100 * 2, "the calls were grouped"
        for t in range(6):
            for i in range(100):
                cells = store.read_row("t", f"r{t}-{i}".encode())
                if t % 2:
                    assert isinstance(outcomes.pop(t * 1000 + i), InvalidArgumentError)
                    assert cells == {}
                else:
                    assert cells[("l", b"q")][0][1] == b"locked"
                    assert cells[("d", b"q")] == [(1, b"v")]
        assert outcomes == {}


def test_a_table_dropped_and_created_again_by_another_process_is_read_anew(
    tmp_path: Path,
) -> None:
    """Reads remember a table's id; another process (here another instance) dropping the
    table and creating one of the same name must not leave them reading the old id."""
    path = str(tmp_path / "store")
    with EmbeddedStore(path) as reader, EmbeddedStore(path) as other:
        reader.create_table("t", FAMILIES)
        reader.put("t", [Put(b"r", "d", b"q", 1, b"old")])
        assert reader.read_row("t", b"r", [("d", b"q")]) == {("d", b"q"): [(1, b"old")]}
        assert reader.read_row("t", b"r", [("d", b"q")]) == {("d", b"q"): [(1, b"old")]}
        other.drop_table("t")
        other.create_table("t", [FamilySpec("d", max_versions=1), FamilySpec("x")])
        other.put("t", [Put(b"r", "d", b"q", 2, b"new"), Put(b"r", "x", b"q", 2, b"x")])
        assert reader.read_row("t", b"r", [("d", b"q")]) == {("d", b"q"): [(2, b"new")]}
        # The new table's families, not the old one's, are what a read is checked against.
        with pytest.raises(InvalidArgumentError):
            reader.read_row("t", b"r", [("l", b"q")])
        other.drop_table("t")
        other.create_table("t", [FamilySpec("y")])
        other.put("t", [Put(b"r", "y", b"q", 3, b"y")])
        assert reader.read_row("t", b"r", [("y", b"q")]) == {("y", b"q"): [(3, b"y")]}
        other.drop_table("t")
        with pytest.raises(TableNotFoundError):
            reader.read_row("t", b"r", [("d", b"q")])


def test_a_small_read_is_one_statement_and_a_lone_write_has_no_savepoint(
    tmp_path: Path,
) -> None:
    """Every SQLite statement costs a GIL hand-off, so the common calls are pinned: a read
    of a few cells of a known table is one statement (its own snapshot), and a write call
    alone in its group is BEGIN IMMEDIATE, its statements, COMMIT."""
    with EmbeddedStore(str(tmp_path / "store")) as store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"r", "d", b"q", 1, b"v")])
        store.read_row("t", b"r", [("d", b"q")])  # learns the table
        statements: list[str] = []
        store._conn().set_trace_callback(statements.append)
        cells = store.read_rows("t", [b"r", b"s"], [("d", b"q"), ("l", b"q")])
        assert cells == {b"r": {("d", b"q"): [(1, b"v")]}}
        assert len(statements) == 1 and statements[0].startswith("SELECT"), statements
        statements.clear()
        assert store.compare_and_set("t", b"r", "l", b"q", None, b"lock")
        verbs = [s.split()[0] for s in statements]
        assert verbs[0] == "BEGIN" and verbs[-1] == "COMMIT", statements
        assert "SAVEPOINT" not in verbs and len(verbs) <= 5, statements


@pytest.mark.parametrize("count", [20, 150])
def test_compare_and_sets_of_many_cells_take_a_fixed_number_of_statements(
    tmp_path: Path, count: int
) -> None:
    """A transaction locks and commits its cells in compare-and-sets of many cells: those
    read the table, the store clock and every cell's newest version in one statement per 64
    cells, whatever their number, then write every new version in one statement per 64
    rows and drop the versions they replace in one more, with each item decided on its own
    as if they ran one after the other.  Every statement inside the write mutex is a GIL
    hand-off: their number must not grow with the cells."""
    with EmbeddedStore(str(tmp_path / "store")) as store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"r%03d" % i, "l", b"q", 1, b"old") for i in range(0, count, 2)])
        statements: list[str] = []
        store._conn().set_trace_callback(statements.append)
        items = [
            CompareAndSet(b"r%03d" % i, "l", b"q", b"old" if i % 4 == 0 else None, b"new")
            for i in range(count)
        ]
        applied = store.compare_and_set_many("t", items)
        # Even rows hold "old": those expecting it apply; odd rows are empty: those expecting
        # nothing apply.  Rows 2, 6, 10, ... hold "old" but expect nothing: refused.
        assert applied == [i % 4 == 0 or i % 2 == 1 for i in range(count)]
        verbs = [s.split()[0] for s in statements]
        chunks = -(-count // 64)
        replaced = sum(1 for i in range(count) if i % 4 == 0)  # applied over an old version
        assert verbs[0] == "BEGIN" and verbs[-1] == "COMMIT", statements
        assert verbs.count("SELECT") == chunks, statements
        assert verbs.count("UPDATE") == 1, statements  # the store clock
        assert verbs.count("INSERT") == -(-sum(applied) // 64), statements
        assert verbs.count("DELETE") == -(-replaced // 64), statements
        assert len(verbs) == 3 + chunks + verbs.count("INSERT") + verbs.count("DELETE")
        for i, item in enumerate(items):
            versions = store.read_row("t", item.row, [("l", b"q")]).get(("l", b"q"), [])
            assert versions[0][1] == (b"new" if applied[i] else b"old"), i
            assert len(versions) == 1, "the lock family keeps one version"


def test_finished_threads_do_not_leak_connections(tmp_path: Path) -> None:
    with EmbeddedStore(str(tmp_path / "store")) as store:
        store.create_table("t", FAMILIES)

        def use() -> None:
            store.put("t", [Put(b"r", "d", b"q", 1, b"v")])

        fds_before = len(os.listdir("/proc/self/fd"))
        for _ in range(60):
            thread = threading.Thread(target=use)
            thread.start()
            thread.join()
        fds_after = len(os.listdir("/proc/self/fd"))
        # Each connection holds file descriptors; 60 leaked ones would show.
        assert fds_after - fds_before < 10


def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path / "store"))
    store.create_table("t", FAMILIES)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.read_row("t", b"r")


# --------------------------------------------------------------------------- bad directories


def test_a_new_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store"
    with EmbeddedStore(str(path)) as store:
        assert store.list_tables() == []
    assert (path / DB_FILE).is_file()


def test_a_file_is_not_a_store_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("hello")
    with pytest.raises(StoreError, match="not a directory") as info:
        EmbeddedStore(str(path))
    assert str(path) in str(info.value)


def test_a_foreign_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not an embedded store") as info:
        EmbeddedStore(str(tmp_path))
    assert "notes.txt" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing was scattered there


def test_a_garbage_database_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / DB_FILE).write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match="not a database"):
        EmbeddedStore(str(tmp_path))


def test_another_sqlite_database_is_refused(tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / DB_FILE)
    other.execute("CREATE TABLE something (x)")
    other.commit()
    other.close()
    with pytest.raises(StoreError, match="not an embedded store"):
        EmbeddedStore(str(tmp_path))


def test_a_refused_database_is_left_as_it_was(tmp_path: Path) -> None:
    # Refused before the switch to WAL, which would rewrite the header of this one.
    other = sqlite3.connect(tmp_path / DB_FILE)
    other.execute("CREATE TABLE something (x)")
    other.commit()
    other.close()
    before = (tmp_path / DB_FILE).read_bytes()
    for create in (True, False):
        with pytest.raises(StoreError, match="not an embedded store"):
            EmbeddedStore(str(tmp_path), create=create)
    assert (tmp_path / DB_FILE).read_bytes() == before
    assert os.listdir(tmp_path) == [DB_FILE]


def test_without_create_only_an_existing_store_opens(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(StoreNotFoundError, match="does not exist"):
        EmbeddedStore(str(missing), create=False)
    assert not missing.exists()
    (tmp_path / DB_FILE).write_bytes(b"")  # an empty database: no store yet
    with pytest.raises(StoreNotFoundError, match="empty database, not a store"):
        EmbeddedStore(str(tmp_path), create=False)
    assert (tmp_path / DB_FILE).read_bytes() == b""
    assert os.listdir(tmp_path) == [DB_FILE]
    EmbeddedStore(str(tmp_path)).close()  # created on purpose
    with EmbeddedStore(str(tmp_path), create=False) as store:
        assert store.list_tables() == []


def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    EmbeddedStore(str(tmp_path)).close()
    db = sqlite3.connect(tmp_path / DB_FILE)
    db.execute("UPDATE meta SET value = 99 WHERE key = 'format_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="format version 99"):
        EmbeddedStore(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to any directory")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not readable and writable"):
            EmbeddedStore(str(path))
    finally:
        path.chmod(0o700)


def test_on_disk_format(tmp_path: Path) -> None:
    with EmbeddedStore(str(tmp_path)) as store:
        store.create_table("t", FAMILIES)
        store.put("t", [Put(b"\x00r", "d", b"q", 5, b"value")])
        store.delete_versions("t", [Delete(b"\x00r", "d", b"gone", 9)])
    db = sqlite3.connect(tmp_path / DB_FILE)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        meta = dict(db.execute("SELECT key, value FROM meta"))
        assert meta["format"] == "percolator-embedded-store" and meta["format_version"] == 1
        [(tid, families)] = db.execute("SELECT id, families FROM tables WHERE name = 't'")
        assert '"max_versions": 1' in families
        assert db.execute("SELECT * FROM cells").fetchall() == [
            (tid, "d", b"\x00r", b"q", 5, b"value")
        ]
        assert db.execute("SELECT * FROM delete_masks").fetchall() == [
            (tid, "d", b"\x00r", b"gone", 9)
        ]
    finally:
        db.close()
