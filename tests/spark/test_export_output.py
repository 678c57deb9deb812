"""Where an export may write (spark_jobs/export.py, check_output): checked before the JVM
starts, so a typo in ``--output`` never deletes or pollutes what is there."""

from __future__ import annotations

from pathlib import Path

import pytest
from percolator.spark_jobs.export import check_output

from percolator.cli import main
from percolator.errors import ConfigError
from percolator.store import open_store


def _store(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "store"
    open_store(f"embedded:{path}").close()
    return f"embedded:{path}", path


@pytest.mark.parametrize("where", ["the store", "its parent", "inside it"])
@pytest.mark.parametrize("mode", ["overwrite", "errorifexists"])
def test_an_output_at_in_or_around_the_store_is_refused(
    tmp_path: Path, where: str, mode: str
) -> None:
    url, path = _store(tmp_path)
    output = {"the store": path, "its parent": tmp_path, "inside it": path / "out"}[where]
    with pytest.raises(ConfigError, match="is, holds or lies inside the store's directory"):
        check_output(str(output), mode, url)
    assert (path / "percolator-store.sqlite3").exists()


def test_the_default_store_is_protected_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    open_store("embedded:./percolator-data").close()
    with pytest.raises(ConfigError, match="inside the store's directory"):
        check_output(".", "overwrite", None)


def test_overwrite_replaces_only_an_earlier_export(tmp_path: Path) -> None:
    url, _ = _store(tmp_path)
    export = tmp_path / "export.parquet"
    export.mkdir()
    for name in ("part-00000-x.snappy.parquet", ".part-00000-x.snappy.parquet.crc", "_SUCCESS"):
        (export / name).write_bytes(b"")
    check_output(str(export), "overwrite", url)  # an earlier export: may be replaced
    check_output(str(tmp_path / "new.parquet"), "overwrite", url)  # nothing there yet
    (tmp_path / "empty").mkdir()
    check_output(str(tmp_path / "empty"), "overwrite", url)

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "part-1.parquet").write_bytes(b"")
    (notes / "thesis.tex").write_bytes(b"years of work")
    a_file = tmp_path / "report.csv"
    a_file.write_text("a,b\n")
    for output in (notes, a_file):
        with pytest.raises(ConfigError, match="is not an earlier export"):
            check_output(str(output), "overwrite", url)
    assert (notes / "thesis.tex").exists() and a_file.exists()


def test_export_cli_refuses_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, path = _store(tmp_path)
    code = main(
        ["export", "--store", url, "--table", "t", "--output", str(path), "--mode", "overwrite"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("percolator: error: export output") and "store's directory" in err
    assert (path / "percolator-store.sqlite3").exists()
