"""open_oracle: the oracle an ``oracle=`` spec names, found by URL scheme through entry
points, with clear errors for everything else."""

from __future__ import annotations

import importlib.metadata

import pytest

import percolator
from percolator.errors import ConfigError
from percolator.store.base import Store
from percolator.store.memory import MemoryStore
from percolator.timestamps import LocalOracle, TimestampOracle
from percolator.timestamps.factory import GROUP, open_oracle

_OPENED: list[tuple[str, Store]] = []


class FakeOracle(TimestampOracle):
    def get_timestamp(self) -> int:
        return 1


def open_fake(spec: str, store: Store) -> TimestampOracle:
    _OPENED.append((spec, store))
    return FakeOracle()


def not_an_oracle(spec: str, store: Store) -> object:
    return "a string"


def fails(spec: str, store: Store) -> TimestampOracle:
    raise RuntimeError("boom")


def plugin(scheme: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=scheme, value=value, group=GROUP)


def test_none_is_the_local_oracle_on_the_store() -> None:
    store = MemoryStore()
    oracle = open_oracle(None, store)
    assert isinstance(oracle, LocalOracle) and oracle.store is store


def test_an_oracle_object_is_used_as_it_is() -> None:
    oracle = FakeOracle()
    assert open_oracle(oracle, MemoryStore()) is oracle


def test_a_scheme_is_opened_by_the_entry_point_of_that_name() -> None:
    store = MemoryStore()
    _OPENED.clear()
    oracle = open_oracle("Fake://somewhere", store, [plugin("fake", f"{__name__}:open_fake")])
    assert isinstance(oracle, FakeOracle)
    assert [("Fake://somewhere", store)] == _OPENED


def test_an_unknown_scheme_is_a_clear_error_naming_it_and_the_installed_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        open_oracle("zk://h:1", MemoryStore(), [plugin("fake", f"{__name__}:open_fake")])
    message = str(caught.value)
    assert "'zk'" in message and "percolator.oracles" in message and "fake://" in message


def test_connect_with_an_unknown_oracle_scheme_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"no timestamp oracle is installed for the scheme 'zk'"):
        percolator.connect("memory:", oracle="zk://h:1")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no_such_module_here:open", "cannot load the 'fake' oracle 'no_such_module_here:open'"),
        (f"{__name__}:not_an_oracle", "gave 'a string', not a TimestampOracle"),
        (f"{__name__}:fails", "failed: RuntimeError: boom"),
        (f"{__name__}:GROUP", "not a callable"),
    ],
)
def test_a_broken_plugin_is_a_config_error_naming_it(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_oracle("fake://h:1", MemoryStore(), [plugin("fake", value)])


def test_a_non_string_spec_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="grpc:// URL string"):
        open_oracle(7070, MemoryStore())  # type: ignore[arg-type]
