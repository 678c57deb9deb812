"""Byte codecs of the protocol records (format version 1)."""

from __future__ import annotations

import pytest

from percolator.records import CommitInfo, Kind, LockCell, LockInfo, RecordError, WriteRecord

LOCK = LockInfo(123, 3000, Kind.PUT, "table", b"\x00row\xff", "col/\u00fc")
COMMIT = CommitInfo(200, 100, Kind.DELETE)


@pytest.mark.parametrize(
    "cell",
    [
        LockCell(),
        LockCell(lock=LOCK),
        LockCell(last_commit=COMMIT),
        LockCell(lock=LOCK, last_commit=COMMIT, rolled_back=99),
        LockCell(last_commit=COMMIT, rolled_back=2**63 - 1),
    ],
)
def test_lock_cell_round_trip(cell: LockCell) -> None:
    data = cell.encode()
    assert data  # never empty: "expected absent" can never match a real lock cell
    assert LockCell.decode(data) == cell


def test_lock_cell_state_changes_never_repeat_bytes() -> None:
    before = LockCell(last_commit=COMMIT)
    locked = before.with_lock(LOCK)
    rolled_back = locked.rolled_back_state()
    committed = locked.committed(300)
    encodings = {before.encode(), locked.encode(), rolled_back.encode(), committed.encode()}
    assert len(encodings) == 4
    assert rolled_back.last_commit == COMMIT and rolled_back.rolled_back == LOCK.start_ts
    assert committed.last_commit == CommitInfo(300, LOCK.start_ts, LOCK.kind)


def test_write_record_round_trip() -> None:
    for record in (WriteRecord(Kind.PUT, 1), WriteRecord(Kind.DELETE, 2**64 - 1)):
        assert WriteRecord.decode(record.encode()) == record


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02" + bytes(9),
        b"\x01\x01",
        LockCell(lock=LOCK).encode()[:-1],
        LockCell().encode() + b"x",
    ],
)
def test_malformed_lock_cells_are_rejected(data: bytes) -> None:
    with pytest.raises(RecordError):
        LockCell.decode(data)


@pytest.mark.parametrize("data", [b"", b"\x01\x01", b"\x02\x01" + bytes(8), b"\x01\x07" + bytes(8)])
def test_malformed_write_records_are_rejected(data: bytes) -> None:
    with pytest.raises(RecordError):
        WriteRecord.decode(data)


def test_with_lock_keeps_the_rest_of_the_state() -> None:
    cell = LockCell(last_commit=COMMIT, rolled_back=99)
    assert cell.with_lock(LOCK) == LockCell(lock=LOCK, last_commit=COMMIT, rolled_back=99)


def test_cell_key_survives_pickling_into_a_process_with_another_hash_seed() -> None:
    """A key caches its hash, and str hashes differ between processes: an unpickled key must
    hash as a key built there, or dict lookups of it would silently miss."""
    import base64
    import pickle
    import subprocess
    import sys

    from percolator.protocol.cells import CellKey

    key = CellKey("table", b"row", "col/\u00fc")
    assert key.qualifier == "col/\u00fc".encode()
    assert hash(key) == hash(CellKey("table", b"row", "col/\u00fc"))
    blob = base64.b64encode(pickle.dumps({key: 1})).decode()
    check = (
        "import base64, pickle\n"
        "from percolator.protocol.cells import CellKey\n"
        f"d = pickle.loads(base64.b64decode({blob!r}))\n"
        "k = CellKey('table', b'row', 'col/\\u00fc')\n"
        "assert d[k] == 1 and next(iter(d)).qualifier == k.qualifier, d\n"
    )
    for seed in ("1", "2"):
        subprocess.run(
            [sys.executable, "-c", check], check=True, env={"PYTHONHASHSEED": seed, "PATH": ""}
        )
