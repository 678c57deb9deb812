"""The failpoint actions themselves (percolator/failpoints.py): which hits fire, and which
specs are refused before anything is turned on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from percolator import failpoints
from percolator.errors import ConfigError
from percolator.failpoints import FailpointError

POINT = "commit.before_primary"


@pytest.fixture(autouse=True)
def all_off() -> Iterator[None]:
    failpoints.disable()
    yield
    failpoints.disable()


def fired(hits: int) -> list[int]:
    """The 1-based hits of :data:`POINT`, among the next ``hits``, that raised."""
    out = []
    for hit in range(1, hits + 1):
        try:
            failpoints.failpoint(POINT)
        except FailpointError:
            out.append(hit)
    return out


def test_count_fires_once_on_the_nth_hit() -> None:
    failpoints.enable(POINT, "count:3:raise")
    assert fired(10) == [3]


def test_every_fires_on_each_multiple_of_n() -> None:
    failpoints.enable(POINT, "every:4:raise")
    assert fired(13) == [4, 8, 12]
    failpoints.enable(POINT, "every:1:raise")  # re-enabling starts counting again
    assert fired(3) == [1, 2, 3]


def test_other_points_pass() -> None:
    failpoints.enable("commit.after_primary", "every:1:raise")
    assert fired(5) == []


@pytest.mark.parametrize(
    "action",
    [
        "every:0:raise",
        "every:x:raise",
        "every:2",
        "every:2:explode",
        "count:0:raise",
        "count:2",
        # digits str.isdigit() takes: "²" int() refuses, "٣" int() reads as 3
        "count:²:raise",
        "every:٣:raise",
        "sleep:²",
    ],
)
def test_a_malformed_action_is_refused(action: str) -> None:
    with pytest.raises(ConfigError, match=r"failpoint action"):
        failpoints.enable(POINT, action)
    assert fired(3) == []


def test_the_environment_spec_accepts_every() -> None:
    spec = f"{POINT}=every:2:raise; commit.after_primary=count:1:raise"
    assert failpoints.parse_env(spec) == {
        POINT: "every:2:raise",
        "commit.after_primary": "count:1:raise",
    }
