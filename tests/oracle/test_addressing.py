"""The gRPC oracle's URLs: ``percolator.connect(oracle="grpc://...")`` finds the client by its
scheme, and every malformed spec is a clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from percolator.oracle.addressing import TOKEN_ENV, check_listen_address, parse_oracle_url
from percolator.oracle.client import GrpcOracleClient

import percolator
from percolator.errors import ConfigError
from percolator.store.memory import MemoryStore
from percolator.timestamps.factory import open_oracle


def test_grpc_urls_give_a_client_with_every_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    oracle = open_oracle("grpc://127.0.0.1:7070,[::1]:7071", MemoryStore())
    try:
        assert isinstance(oracle, GrpcOracleClient)
        assert oracle.addresses == ["127.0.0.1:7070", "[::1]:7071"]
    finally:
        oracle.close()


def test_connect_finds_the_grpc_client_by_its_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for scheme in ("grpc", "GRPCS"):
        with percolator.connect("memory:", oracle=f"{scheme}://127.0.0.1:7070") as client:
            assert isinstance(client.oracle, GrpcOracleClient)
            assert client.oracle.addresses == ["127.0.0.1:7070"]


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
        ("grpc://h:99999", "must look like HOST:PORT, PORT in 1..65535"),
        ("grpc://h:1,", "must look like HOST:PORT"),
        ("grpc://h:1?bogus=1", r"unknown option\(s\) \['bogus'\]"),
        ("grpc://h:1?ca=/x.pem", "ca= needs grpcs://"),
        ("grpc://h:1?timeout_ms=-1", "timeout_ms must be a positive integer"),
        ("grpc://h:1?token_file=/nonexistent/t", "cannot read token_file"),
        # digits str.isdigit() takes: "²" int() refuses, "٣" int() reads but gRPC does not
        ("grpc://h:²", "must look like HOST:PORT"),
        ("grpc://h:٣", "must look like HOST:PORT"),
        ("grpc://h:1?timeout_ms=²", "timeout_ms must be a positive integer"),
        ("grpc://h:1?rpc_timeout_ms=٣", "rpc_timeout_ms must be a positive integer"),
        # a command-line byte that is not UTF-8 ($'\\xff') arrives as a lone surrogate
        ("grpc://\udcff:1", r"host '\\udcff' is not a host name or address"),
    ],
)
def test_bad_specs_are_config_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_oracle(spec, MemoryStore())


def test_a_token_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path) -> None:
    token_file = tmp_path / "garbage.bin"
    token_file.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=f"token_file '{token_file}' is not UTF-8 text"):
        parse_oracle_url(f"grpc://h:1?token_file={token_file}")


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:²", "must look like HOST:PORT"),
        ("127.0.0.1:٣", "must look like HOST:PORT"),
        ("\udcff:0", r"host '\\udcff' is not a host name or address"),
    ],
)
def test_bad_listen_addresses_are_config_errors(address: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_listen_address(address)
    assert check_listen_address("[::1]:0") == ("::1", 0)
    assert check_listen_address("bücher.example:7070") == ("bücher.example", 7070)


def test_a_url_of_another_scheme_is_not_understood_by_the_grpc_parser() -> None:
    with pytest.raises(ConfigError, match="not understood"):
        parse_oracle_url("http://h:1")


def test_importing_the_oracle_package_loads_neither_the_client_nor_grpc() -> None:
    # The oracle builds on the engine; importing it must not pull the engine's client in
    # (that was an import cycle), nor gRPC before a module that needs it is imported.
    code = (
        "import sys, percolator.oracle, percolator.oracle.addressing\n"
        "loaded = sorted(m for m in ('percolator.client', 'grpc') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "", f"loaded: {result.stdout.strip()}"
