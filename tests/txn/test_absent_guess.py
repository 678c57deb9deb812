"""Prewrites that take unread cells as absent (protocol/prewrite.py, AbsentCells), forced on
for every cell, under concurrency and failpoints: blind writers of the same keys stay atomic
and serial.  Every guess after the first commit is wrong (the cells exist), so each prewrite
goes through a failed compare-and-set from absent, a read, and a second try."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import percolator
from percolator.errors import PercolatorError, UndeterminedCommitError
from percolator.store import Store
from percolator.testing import ManualOracle
from tests.txn._bank_worker import FailpointChaos

TABLE = "guessed"
KEYS = [b"k0", b"k1", b"k2", b"k3"]
LOCK_TTL_MS = 100


def test_blind_writers_taking_every_cell_as_absent_stay_atomic(store: Store) -> None:
    client = percolator.connect(
        store, oracle=ManualOracle(), lock_ttl_ms=LOCK_TTL_MS, lock_wait_ms=5000
    )
    client.create_table(TABLE)
    client._ctx.absent_cells.guess = lambda table, cells=1: True  # type: ignore[method-assign]
    committed: set[bytes | None] = {None}  # values a committed (or undetermined) txn wrote
    done = threading.Event()
    torn: list[dict[bytes, bytes | None]] = []
    guard = threading.Lock()

    crashed: list[BaseException] = []

    def write(n: int) -> None:
        try:
            write_all(n)
        except BaseException as exc:  # a thread's death must fail the test
            crashed.append(exc)

    def write_all(n: int) -> None:
        rng = random.Random(n)
        for i in range(80):
            value = None if rng.random() < 0.2 else b"%d-%d" % (n, i)
            txn = client.transaction()
            try:
                for key in rng.sample(KEYS, len(KEYS)):  # any order: any primary
                    if value is None:
                        txn.delete(TABLE, key, "c")
                    else:
                        txn.set(TABLE, key, "c", value)
                with guard:
                    committed.add(value)  # before the outcome: undetermined ones count
                txn.commit()
            except UndeterminedCommitError:
                pass  # its outcome shows in the store; the value counts as committed
            except PercolatorError:
                with contextlib.suppress(PercolatorError):
                    txn.rollback()

    def read() -> None:
        while not done.is_set():
            try:
                with client.snapshot() as snap:
                    seen = {key: snap.get(TABLE, key, "c") for key in KEYS}
            except PercolatorError:
                continue
            if len(set(seen.values())) != 1:
                torn.append(seen)

    reader = threading.Thread(target=read)
    reader.start()
    with FailpointChaos(seed=3):
        writers = [threading.Thread(target=write, args=(n,)) for n in range(6)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
    done.set()
    reader.join()
    time.sleep(LOCK_TTL_MS / 1000 * 1.5)  # locks of failed transactions expire: resolved
    with client.snapshot() as snap:
        final = {key: snap.get(TABLE, key, "c") for key in KEYS}
    client.close()
    assert crashed == []
    assert torn == [], f"a snapshot saw part of a transaction: {torn[:3]}"
    assert len(set(final.values())) == 1, final
    assert final[KEYS[0]] in committed
    assert len(committed) > 20, "too few transactions got as far as their commit"
