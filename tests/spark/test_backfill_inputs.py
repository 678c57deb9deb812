"""Backfill input problems: bad inputs fail fast with one clear message and write nothing;
rows that cannot be mapped are counted, shown and judged by the threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from percolator.spark_jobs.backfill import run_backfill
from percolator.spark_jobs.prepare import BackfillOptions, BadRowsError, ColumnMapping

from percolator.errors import ConfigError
from tests.spark.helpers import ITEMS, connect, table_rows

pytestmark = pytest.mark.spark


def options(url: str, path: str, **extra: Any) -> BackfillOptions:
    base: dict[str, Any] = {"store": url, "table": ITEMS, "inputs": (path,), "key": "id"}
    base.update(extra)
    return BackfillOptions(**base)


def nothing_written(url: str) -> bool:
    with connect(url) as client:
        return ITEMS not in client.list_tables() or table_rows(client, ITEMS) == {}


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_missing_input_fails_before_spark_reads(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(ConfigError) as exc:
        run_backfill(spark, options(embedded_url, str(missing)))
    assert one_line(exc) == f"input path(s) not found: {missing}"
    with pytest.raises(ConfigError, match="cannot tell the input format"):
        (tmp_path / "data.bin").write_bytes(b"x")
        run_backfill(spark, options(embedded_url, str(tmp_path / "data.bin")))
    assert nothing_written(embedded_url)


def test_bad_key_and_value_columns_fail_with_the_column_named(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "in.parquet"
    spark.createDataFrame(
        [("a", 1.5, [1, 2], "x")], "id STRING, score DOUBLE, tags ARRAY<INT>, value STRING"
    ).write.parquet(str(path))
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"key": "ident"},
            "key column 'ident' is not in the input; input columns: "
            "['id', 'score', 'tags', 'value']",
        ),
        ({"key": "score"}, "key column 'score' has type double; a row key must be string"),
        ({"columns": (ColumnMapping("tags"),)}, "value column 'tags' has type array<int>"),
        ({"columns": (ColumnMapping("valu"),)}, "value column 'valu' is not in the input"),
        ({"columns": (ColumnMapping("value", "!ack"),)}, "column '!ack' is reserved"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError) as exc:
            run_backfill(spark, options(embedded_url, str(path), **extra))
        assert message in one_line(exc)
    assert nothing_written(embedded_url)


def test_schema_mismatch_fails_fast(spark: Any, embedded_url: str, tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    spark.createDataFrame([("a", 1)], "id STRING, rank INT").write.parquet(str(path))
    with pytest.raises(ConfigError) as exc:
        run_backfill(spark, options(embedded_url, str(path), schema="id STRING, rank STRING"))
    assert "does not match the schema: column 'rank' is int, expected string" in one_line(exc)
    # Files that disagree with each other: Spark fails reading them; so does the job,
    # before writing anything.
    spark.createDataFrame([("b", "x")], "id STRING, rank STRING").write.mode("append").parquet(
        str(path)
    )
    with pytest.raises(ConfigError) as exc:
        run_backfill(spark, options(embedded_url, str(path)))
    assert one_line(exc).startswith(f"cannot read input ['{path}'] as parquet: ")
    # A CSV header that disagrees with the schema.
    csv = tmp_path / "in.csv"
    csv.write_text("id,label\na,x\n")
    with pytest.raises(ConfigError) as exc:
        run_backfill(spark, options(embedded_url, str(csv), schema="id STRING, value STRING"))
    assert "cannot read input" in one_line(exc)
    assert nothing_written(embedded_url)


def test_bad_rows_are_counted_shown_and_fail_the_job(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "in.jsonl"
    records: list[dict[str, Any]] = [{"id": f"k{i}", "value": f"v{i}"} for i in range(10)]
    records += [
        {"value": "no key"},
        {"id": "", "value": "empty key"},
        {"id": "big", "value": "x" * 100},
        {"id": "nothing", "value": None},
    ]
    lines = [json.dumps(r) for r in records] + ["{not json"]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadRowsError) as exc:
        run_backfill(spark, options(embedded_url, str(path), max_value_bytes=50))
    report = exc.value.report
    assert report.bad_by_reason == {
        "missing-key": 2,
        "value-too-large": 1,
        "no-values": 1,
        "malformed-record": 1,
    }
    assert (report.rows_read, report.rows_good, report.bad_rows) == (15, 10, 5)
    message = str(exc.value)
    assert message.startswith("backfill items-")
    assert "5 of 15 rows cannot be mapped; nothing was written" in message
    assert "column 'value' is 100 bytes, the limit is 50" in message
    assert "{not json" in message
    assert nothing_written(embedded_url)

    # Within an explicit threshold the good rows are written and the bad ones reported.
    done = run_backfill(spark, options(embedded_url, str(path), max_value_bytes=50, max_bad_rows=5))
    assert (done.rows_written, done.bad_rows) == (10, 5)
    assert "bad rows: 1 malformed-record, 2 missing-key" in done.summary()
    with connect(embedded_url) as client:
        assert sorted(table_rows(client, ITEMS)) == sorted(f"k{i}".encode() for i in range(10))
    with pytest.raises(BadRowsError, match=r"more than the allowed fraction 0\.1"):
        run_backfill(
            spark, options(embedded_url, str(path), max_value_bytes=50, max_bad_fraction=0.1)
        )


def test_csv_with_a_schema_counts_records_that_do_not_parse(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    csv = tmp_path / "in.csv"
    csv.write_text("id,rank\na,1\nb,two\nc,3\n")
    with pytest.raises(BadRowsError) as exc:
        run_backfill(spark, options(embedded_url, str(csv), schema="id STRING, rank INT"))
    assert exc.value.report.bad_by_reason == {"malformed-record": 1}
    assert "b,two" in str(exc.value)


def test_csv_rows_that_do_not_fit_the_header_are_bad_rows_without_a_schema(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """Without a schema Spark fits every row to the header silently (extra fields dropped,
    missing ones null): such rows must be reported, not written half."""
    csv = tmp_path / "in.csv"
    csv.write_text('id,a,b\nk1,x1,y1\nk2,hello, world,y2\nk3,x3\nk4,"unterminated,y4\nk5,x5,y5\n')
    with pytest.raises(BadRowsError) as exc:
        run_backfill(spark, options(embedded_url, str(csv)))
    assert exc.value.report.bad_by_reason == {"malformed-record": 3}
    assert "k2,hello, world,y2" in str(exc.value)
    assert nothing_written(embedded_url)
    # Rows that fit go in as strings, as before.
    csv.write_text("id,a,b\nk1,007,y1\nk5,x5,\n")
    run_backfill(spark, options(embedded_url, str(csv)))
    with connect(embedded_url) as client:
        assert table_rows(client, ITEMS) == {b"k1": {"a": b"007", "b": b"y1"}, b"k5": {"a": b"x5"}}


def test_csv_rows_that_do_not_fit_the_first_row_are_bad_rows_without_a_header(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """Without a header, Spark fits every row to the first row's field count as silently."""
    csv = tmp_path / "in.csv"
    csv.write_text("k1,1,2\nk2,3\nk3,4,5,6\n")
    extra = {"key": "_c0", "reader_options": {"header": "false"}}
    with pytest.raises(BadRowsError) as exc:
        run_backfill(spark, options(embedded_url, str(csv), **extra))
    assert exc.value.report.bad_by_reason == {"malformed-record": 2}
    assert nothing_written(embedded_url)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("columnNameOfCorruptRecord", "raw", "columnNameOfCorruptRecord is set by the job"),
        ("mode", "DROPMALFORMED", "would drop malformed rows without counting them"),
    ],
)
def test_reader_options_that_would_hide_malformed_rows_are_refused(
    spark: Any, embedded_url: str, tmp_path: Path, option: str, value: str, message: str
) -> None:
    csv = tmp_path / "in.csv"
    csv.write_text("id,a,b\nk1,1,2\nk2,3\n")
    with pytest.raises(ConfigError, match=message) as exc:
        run_backfill(spark, options(embedded_url, str(csv), reader_options={option: value}))
    one_line(exc)
    assert nothing_written(embedded_url)


def test_input_replaced_after_the_check_is_not_written(
    spark: Any, embedded_url: str, tmp_path: Path
) -> None:
    """The write pass writes the rows the check pass read and judged, not a second reading
    of the input: a file replaced in between (here with a bad row and other values) changes
    nothing that is written."""
    path = tmp_path / "in.json"
    checked = [{"id": f"k{i}", "value": f"checked{i}"} for i in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in checked))
    replaced = [{"id": "", "value": "bad"}] + [
        {"id": f"k{i}", "value": f"replaced{i}"} for i in range(30)
    ]

    def progress(line: str) -> None:
        if line.startswith("writing "):  # checked, about to write
            path.write_text("".join(json.dumps(row) + "\n" for row in replaced))

    report = run_backfill(spark, options(embedded_url, str(path)), progress=progress)
    assert (report.rows_read, report.bad_rows, report.rows_written) == (20, 0, 20)
    with connect(embedded_url) as client:
        assert table_rows(client, ITEMS) == {
            f"k{i}".encode(): {"value": f"checked{i}".encode()} for i in range(20)
        }


@pytest.mark.parametrize("spec", ["", "=v", " = ", "v=", "v= "])
def test_a_column_mapping_with_an_empty_side_is_refused(spec: str) -> None:
    """``v=`` (a target lost to an unset shell variable) is not ``v``."""
    with pytest.raises(ConfigError, match="must look like SOURCE or SOURCE=TARGET"):
        ColumnMapping.parse(spec)
    assert ColumnMapping.parse("v").column == "v"
    assert ColumnMapping.parse(" v = w ").column == "w"
