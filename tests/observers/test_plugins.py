"""Finding, loading and validating observer plugins (observers/plugins.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from docpipeline.pipeline import CanonicalIndex, DuplicateClusters, InboundLinks
from percolator.observers.plugins import GROUP, PluginError, load, load_observers

from tests.observers import helpers
from tests.observers.procs import PROJECT_ROOT, cli_env


def entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name, value, GROUP)


def make_observer() -> helpers.RunLogger:
    return helpers.RunLogger()


def failing_factory() -> helpers.RunLogger:
    raise RuntimeError("no database configured")


def test_a_class_an_instance_or_a_factory_loads() -> None:
    assert isinstance(
        load(entry_point("run-logger", "tests.observers.helpers:RunLogger")), helpers.RunLogger
    )
    assert load(entry_point("run-logger", f"{__name__}:make_observer")).name == "run-logger"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("broken", "tests.observers.no_such_module:Thing", "cannot load .*ModuleNotFoundError"),
        ("broken", "tests.observers.helpers:Missing", "cannot load .*AttributeError"),
        ("broken", "tests.observers.helpers:NOT_AN_OBSERVER", "is 42: expected an Observer"),
        ("broken", f"{__name__}:failing_factory", "raised while creating.*no database"),
        ("broken", f"{__name__}:entry_point", "raised while creating"),
        ("misnamed", "tests.observers.helpers:RunLogger", "calls itself 'run-logger'"),
    ],
)
def test_a_broken_plugin_is_an_error_naming_it(name: str, value: str, message: str) -> None:
    with pytest.raises(PluginError, match=message) as info:
        load(entry_point(name, value))
    assert info.value.plugin == name
    assert str(info.value).startswith(f"observer plugin {name!r}: ")


def test_a_malformed_declaration_is_a_plugin_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helpers.RunLogger, "columns", ())
    with pytest.raises(PluginError, match=r"'run-logger'.*non-empty sequence"):
        load(entry_point("run-logger", "tests.observers.helpers:RunLogger"))


def test_load_observers_keeps_the_good_ones_and_reports_the_others() -> None:
    points = [entry_point(k, v) for k, v in helpers.PLUGINS.items()]
    result = load_observers(["run-logger", "broken-import", "nope", "mirror"], points)
    assert [o.name for o in result.observers] == ["run-logger", "mirror"]
    assert [e.plugin for e in result.errors] == ["broken-import", "nope"]
    assert "no such plugin" in str(result.errors[1])


def test_load_observers_without_names_loads_every_plugin() -> None:
    points = [entry_point(k, v) for k, v in helpers.PLUGINS.items()]
    result = load_observers(None, points)
    assert sorted(e.plugin for e in result.errors) == [
        "broken-import",
        "misnamed",
        "not-an-observer",
    ]
    assert len(result.observers) == len(helpers.PLUGINS) - 3


def test_the_example_pipeline_is_installed_as_entry_points() -> None:
    result = load_observers(["doc-clusters", "doc-index", "doc-inlinks"])
    assert result.errors == []
    assert [type(o) for o in result.observers] == [DuplicateClusters, CanonicalIndex, InboundLinks]


def test_plugins_declared_by_another_distribution_are_found(plugin_dir: Path) -> None:
    """Real discovery through package metadata (a dist-info directory on the path)."""
    code = (
        "from percolator.observers.plugins import load_observers\n"
        "r = load_observers()\n"
        "print(sorted(o.name for o in r.observers))\n"
        "print(sorted(e.plugin for e in r.errors))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=cli_env(plugin_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert "'run-logger'" in out[0] and "'doc-clusters'" in out[0]
    assert out[1] == "['broken-import', 'misnamed', 'not-an-observer']"
