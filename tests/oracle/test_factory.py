"""open_oracle: which oracle an ``oracle=`` spec names, and clear errors for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest
from percolator.oracle.client import GrpcOracleClient
from percolator.oracle.factory import TOKEN_ENV, open_oracle, parse_oracle_url
from percolator.oracle.local import LocalOracle

from percolator.errors import ConfigError
from percolator.store.memory import MemoryStore


def test_none_is_the_local_oracle_on_the_store() -> None:
    store = MemoryStore()
    oracle = open_oracle(None, store)
    assert isinstance(oracle, LocalOracle) and oracle.store is store


def test_grpc_urls_give_a_client_with_every_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    oracle = open_oracle("grpc://127.0.0.1:7070,[::1]:7071", MemoryStore())
    try:
        assert isinstance(oracle, GrpcOracleClient)
        assert oracle.addresses == ["127.0.0.1:7070", "[::1]:7071"]
    finally:
        oracle.close()


def test_options_tls_token_and_timeouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    addresses, tls, token, timeouts = parse_oracle_url(
        f"grpcs://h:1?ca=/x.pem&token_file={token_file}&timeout_ms=2500&rpc_timeout_ms=300"
    )
    assert (addresses, tls, token, timeouts) == (["h:1"], "/x.pem", "s3cret", (2.5, 0.3))
    assert parse_oracle_url("grpcs://h:1")[1] is True
    assert parse_oracle_url("grpc://h:1")[1:3] == (False, None)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert parse_oracle_url("grpc://h:1")[2] == "from-env"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "not understood"),
        ("local", "not understood"),
        ("http://h:1", "not understood"),
        ("grpc://", "must look like HOST:PORT"),
        ("grpc://h", "must look like HOST:PORT"),
        ("grpc://h:0", "must look like HOST:PORT"),
        ("grpc://h:99999", "must look like HOST:PORT"),
        ("grpc://h:1,", "must look like HOST:PORT"),
        ("grpc://h:1?bogus=1", r"unknown option\(s\) \['bogus'\]"),
        ("grpc://h:1?ca=/x.pem", "ca= needs grpcs://"),
        ("grpc://h:1?timeout_ms=-1", "timeout_ms must be a positive integer"),
        ("grpc://h:1?token_file=/nonexistent/t", "cannot read token_file"),
    ],
)
def test_bad_specs_are_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_oracle(spec, MemoryStore())


def test_a_non_string_spec_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="grpc:// URL string"):
        open_oracle(7070, MemoryStore())  # type: ignore[arg-type]
