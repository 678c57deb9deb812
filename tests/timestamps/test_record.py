"""The persisted oracle record: its byte format and the register that holds it."""

from __future__ import annotations

import pytest

from percolator.errors import OracleError
from percolator.layout import META_FAMILY, META_TABLE
from percolator.store.memory import MemoryStore
from percolator.timestamps.record import (
    ORACLE_QUALIFIER,
    ORACLE_ROW,
    OracleRecord,
    OracleRecordRegister,
)


def test_encode_is_the_documented_version_1_layout() -> None:
    record = OracleRecord(
        epoch=3, high_water=0x0102030405060708, holder="h\u00e9", lease_expiry_ms=10, lease_ms=600
    )
    assert record.encode().hex() == (
        "01"  # format version
        "0000000000000003"  # epoch
        "0102030405060708"  # high_water
        "000000000000000a"  # lease_expiry_ms
        "00000258"  # lease_ms
        "0003"  # holder length in bytes
        "68c3a9"  # holder, UTF-8
    )
    assert OracleRecord.decode(record.encode()) == record


def test_round_trip_of_extremes() -> None:
    top = (1 << 64) - 1
    for record in (
        OracleRecord(epoch=0, high_water=0, holder=""),
        OracleRecord(
            epoch=top,
            high_water=top,
            holder="x" * 1024,
            lease_expiry_ms=top,
            lease_ms=(1 << 32) - 1,
        ),
    ):
        assert OracleRecord.decode(record.encode()) == record


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x02" + bytes(30), "format version 2"),
        (b"\x01" + bytes(10), "truncated"),
        (OracleRecord(1, 2, "ab").encode() + b"!", "header says"),
        (OracleRecord(1, 2, "ab").encode()[:-1], "header says"),
        (OracleRecord(1, 2, "ab").encode()[:-2] + b"\xff\xfe", "not UTF-8"),
    ],
)
def test_decode_rejects_malformed_bytes(data: bytes, message: str) -> None:
    with pytest.raises(OracleError, match=message):
        OracleRecord.decode(data)


@pytest.mark.parametrize(
    "fields",
    [
        {"epoch": -1},
        {"high_water": 1 << 64},
        {"lease_expiry_ms": -5},
        {"lease_ms": 1 << 32},
        {"holder": "x" * 1025},
    ],
)
def test_out_of_range_fields_are_refused(fields: dict[str, object]) -> None:
    base: dict[str, object] = {"epoch": 1, "high_water": 1, "holder": "h"}
    with pytest.raises(OracleError):
        OracleRecord(**{**base, **fields})  # type: ignore[arg-type]


def test_the_register_creates_its_table_once_and_compare_and_sets_exact_bytes() -> None:
    store = MemoryStore()
    register = OracleRecordRegister(store)
    assert register.read().record is None
    assert store.table_exists(META_TABLE)
    OracleRecordRegister(store).ensure_table()  # a second user: no error

    first = OracleRecord(epoch=1, high_water=100, holder="a")
    assert register.compare_and_set(None, first)
    assert not register.compare_and_set(None, first), "absent no longer matches"
    stored = register.read()
    assert stored.record == first and stored.raw == first.encode()

    second = OracleRecord(epoch=2, high_water=200, holder="b")
    assert not register.compare_and_set(OracleRecord(1, 99, "a").encode(), second)
    assert register.compare_and_set(stored.raw, second)
    assert register.read().record == second
    # One version kept: the register holds the record, not a history.
    versions = store.read_row(
        META_TABLE, ORACLE_ROW, columns=[(META_FAMILY, ORACLE_QUALIFIER)], max_versions=10
    )[(META_FAMILY, ORACLE_QUALIFIER)]
    assert len(versions) == 1


def test_a_corrupt_record_is_reported_not_ignored() -> None:
    store = MemoryStore()
    register = OracleRecordRegister(store)
    register.ensure_table()
    store.compare_and_set(META_TABLE, ORACLE_ROW, META_FAMILY, ORACLE_QUALIFIER, None, b"\x07junk")
    with pytest.raises(OracleError, match="format version 7"):
        register.read()
