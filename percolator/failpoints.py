"""Named failpoints at every protocol step, off unless a test turns them on.

A failpoint is a call ``failpoint("commit.before_primary")`` placed between two protocol
steps.  When nothing is configured it costs one dictionary lookup.  Tests turn failpoints on
either in-process (:func:`enable`) or for a subprocess through the environment variable
``PERCOLATOR_FAILPOINTS``, e.g. ``commit.after_primary=crash;prewrite.after_primary=pause``.

Actions:

``crash``       SIGKILL this process (no cleanup, no flush: a real crash)
``pause``       SIGSTOP this process (another process must SIGCONT it)
``raise``       raise :class:`FailpointError`
``unavailable`` raise :class:`~percolator.errors.StoreUnavailableError` (a broken connection)
``sleep:MS``    sleep MS milliseconds
``count:N:ACT`` perform ACT only on the N-th hit (1-based); the hits before pass
``every:N:ACT`` perform ACT on every N-th hit (N, 2N, ...); the others pass.  Which thread
                takes a hit depends on timing, but how many fire does not: tests that need
                faults spread over a workload use it instead of a timer

:data:`POINTS` lists every failpoint the engine has; enabling an unknown name is an error, so
a renamed step cannot silently turn a crash test into a no-op.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from percolator.errors import ConfigError, PercolatorError, StoreUnavailableError
from percolator.numerals import ascii_digits

POINTS = frozenset(
    {
        # prewrite (percolator/protocol/prewrite.py, percolator/committer.py)
        "prewrite.before_primary",
        "prewrite.before_lock",  # data and history written, lock CAS not yet sent
        "prewrite.after_primary",
        "prewrite.after_secondaries",
        # commit (percolator/committer.py; the commit point in percolator/protocol/commit.py)
        "commit.before_notify",
        "commit.before_primary",
        "commit.primary_cas",  # before the primary CAS: 'unavailable' = unknown, not applied
        "commit.primary_cas_applied",  # after it: 'unavailable' = unknown, but applied
        "commit.after_primary",
        "commit.after_write_records",
        "commit.after_secondaries",
        # rollback and lock resolution
        "rollback.after_primary",
        "resolve.before_roll_forward",
        "resolve.before_roll_back",
        # garbage collection
        "gc.after_safe_point",
        "gc.after_versions",
        "gc.before_lock_cells",
        "gc.after_table",
        # timestamp oracle (oracle/server.py): a range taken, the lease not yet re-checked
        "oracle.before_confirm",
        # observers
        "observer.before_commit",
        "observer.after_commit",
        "observer.before_cleanup",
    }
)

ENV_VAR = "PERCOLATOR_FAILPOINTS"


class FailpointError(PercolatorError):
    """Raised by a failpoint whose action is ``raise``."""


_lock = threading.Lock()
_actions: dict[str, str] = {}
_hits: dict[str, int] = {}
_loaded_env = False


def _validate(name: str, action: str) -> None:
    if name not in POINTS:
        raise ConfigError(f"unknown failpoint {name!r}; known: {sorted(POINTS)}")
    base = action.split(":", 2)
    if base[0] in ("count", "every"):
        if len(base) != 3 or not ascii_digits(base[1]) or int(base[1]) < 1:
            raise ConfigError(
                f"failpoint action {action!r} must look like {base[0]}:N:ACTION with N >= 1"
            )
        _validate(name, base[2])
        return
    if base[0] == "sleep":
        if len(base) != 2 or not ascii_digits(base[1]):
            raise ConfigError(f"failpoint action {action!r} must look like sleep:MS")
        return
    if action not in {"crash", "pause", "raise", "unavailable"}:
        raise ConfigError(f"unknown failpoint action {action!r} for {name}")


def enable(name: str, action: str) -> None:
    """Turn a failpoint on in this process."""
    _validate(name, action)
    with _lock:
        _actions[name] = action
        _hits[name] = 0


def disable(name: str | None = None) -> None:
    """Turn one failpoint (or all) off."""
    with _lock:
        if name is None:
            _actions.clear()
            _hits.clear()
        else:
            _actions.pop(name, None)
            _hits.pop(name, None)


def parse_env(spec: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ConfigError(f"{ENV_VAR} entry {item!r} must look like NAME=ACTION")
        _validate(name.strip(), action.strip())
        result[name.strip()] = action.strip()
    return result


def _load_env() -> None:
    global _loaded_env
    with _lock:
        if _loaded_env:
            return
        _loaded_env = True
        spec = os.environ.get(ENV_VAR, "")
    if spec:
        for name, action in parse_env(spec).items():
            enable(name, action)


def failpoint(name: str) -> None:
    """Run the action configured for ``name``, if any."""
    if not _loaded_env:
        _load_env()
    if not _actions:
        return
    with _lock:
        action = _actions.get(name)
        if action is None:
            return
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name]
    _perform(name, action, hit)


def _perform(name: str, action: str, hit: int) -> None:
    if action.startswith("count:"):
        _, n, inner = action.split(":", 2)
        if hit == int(n):
            _perform(name, inner, hit)
        return
    if action.startswith("every:"):
        _, n, inner = action.split(":", 2)
        if hit % int(n) == 0:
            _perform(name, inner, hit)
        return
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # SIGKILL is asynchronous only in theory; never continue past it
    elif action == "pause":
        # Signal the calling thread itself, so it stops before running one more line
        # (SIGSTOP then stops every thread of the process).
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif action == "raise":
        raise FailpointError(f"failpoint {name} fired")
    elif action == "unavailable":
        raise StoreUnavailableError(f"failpoint {name}: connection broken")
    elif action.startswith("sleep:"):
        time.sleep(int(action.split(":", 1)[1]) / 1000)
