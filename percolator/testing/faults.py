"""A store that fails on purpose: :class:`FaultyStore` wraps any :class:`~percolator.store.Store`
and, for the calls a test names, raises, loses the reply, hangs, or runs a hook first.

It drives the paths a real store reaches only by bad luck -- a connection that breaks before
a compare-and-set reaches the server, or after the server applied it (the caller cannot tell
which: see :meth:`Store.compare_and_set`), a write interrupted half-way, a race that must
land between two calls::

    store = FaultyStore(MemoryStore())
    store.fail("compare_and_set")                       # the next one is lost, not applied
    store.fail("compare_and_set", applied=True)         # applied, and then the reply is lost
    store.fail("read_rows", times=3)                    # the next three reads fail
    store.fail("put", when=lambda call: ..., error=KeyboardInterrupt)
    gate = threading.Event()
    store.hang("scan", until=gate)                      # blocks until gate.set()
    store.before("compare_and_set", lambda call: other_writer(), times=1)

``FaultyStore(inner, split_puts=True)`` performs each ``put`` as one call per (row, version),
each seen by the rules as a ``put`` of its own: the weakest atomicity the Store contract
allows (HBase's), on any backend, so a test can stop a put half-way.

Each rule names one method and, optionally, a predicate on the :class:`Call` (its arguments by
name) and how many matching calls it applies to (``times``; ``None``: every one).  A rule is
used up when a matching call *takes* it, which happens before any hook runs: so a hook may call
the store itself (through this wrapper or ``store.inner``) without tripping the fault that is
being injected.  When several ``fail`` (or ``hang``) rules match one call, the oldest takes it;
every matching ``before`` / ``after`` hook runs.

``read_row`` and ``table_exists`` reach the store through ``read_rows`` and ``list_tables``,
``read_cells`` is a ``read_rows`` call for the rules (which see its ``cells`` too), and
``compare_and_set_many`` through one ``compare_and_set`` per item, in order, so rules on those
cover them too (an item carrying ``then_put`` reaches the inner store whole, and the rules see
``then_put`` among its arguments; the wrapper has the inner store's ``conditional_puts``).
A ``scan`` is checked when the caller starts iterating it, as a real backend's scanner would
fail.  The wrapper shares the inner store's ``url`` and
``stats``, so round trips are counted as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from percolator.errors import StoreUnavailableError
from percolator.store.base import (
    Column,
    CompareAndSet,
    Delete,
    FamilySpec,
    Put,
    RowCells,
    ScanOptions,
    Store,
    Version,
    split_cells,
)

#: the store methods a rule may name
METHODS = (
    "create_table",
    "drop_table",
    "list_tables",
    "table_families",
    "read_rows",
    "scan",
    "put",
    "compare_and_set",
    "delete_versions",
)


@dataclass(frozen=True)
class Call:
    """One call to the store, as rules and hooks see it: the method and its arguments by name
    (``call["family"]``)."""

    method: str
    args: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.args[name]


ErrorSpec = BaseException | type[BaseException] | None


@dataclass
class Rule:
    """One scripted fault or hook.  ``remaining`` counts down per matching call (``None``: no
    limit); ``hits`` counts the calls it was applied to, for tests that assert on it."""

    kind: str  # "fail", "hang", "before" or "after"
    method: str
    when: Callable[[Call], bool] | None = None
    remaining: int | None = 1
    applied: bool = False  # fail: let the call reach the store, then raise
    error: ErrorSpec = None
    until: threading.Event | None = None
    hook: Callable[..., object] | None = None
    hits: int = field(default=0)

    def matches(self, call: Call) -> bool:
        if self.method != call.method or self.remaining == 0:
            return False
        return self.when is None or self.when(call)

    def take(self) -> None:
        self.hits += 1
        if self.remaining is not None:
            self.remaining -= 1


class FaultyStore(Store):
    """``inner`` with scripted faults; see the module docstring.  Thread-safe: rules are taken
    under a lock, and hooks, hangs and the inner call run outside it."""

    def __init__(self, inner: Store, *, split_puts: bool = False) -> None:
        super().__init__()
        self.inner = inner
        #: perform each ``put`` as one call per (row, version), in first-appearance order,
        #: each its own ``put`` call for the rules: the weakest atomicity the Store contract
        #: allows (HBase's), so a test can stop a put half-way.
        self.split_puts = split_puts
        self.conditional_puts = inner.conditional_puts
        self.put_call_per_version = inner.put_call_per_version
        self.calls_run_in_parallel = inner.calls_run_in_parallel
        self.url = inner.url
        self.stats = inner.stats
        self._rules: list[Rule] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scripting

    def fail(
        self,
        method: str,
        *,
        times: int | None = 1,
        when: Callable[[Call], bool] | None = None,
        applied: bool = False,
        error: ErrorSpec = None,
    ) -> Rule:
        """Make the next ``times`` matching calls raise ``error`` (default
        :class:`StoreUnavailableError`).  ``applied=False``: the call never reaches the store
        (the request was lost); ``applied=True``: the store performs it and the caller gets the
        error instead of the reply (the outcome is unknown to it)."""
        return self._add(
            Rule("fail", method, when, times, applied=applied, error=error),
        )

    def hang(
        self,
        method: str,
        *,
        until: threading.Event,
        times: int | None = 1,
        when: Callable[[Call], bool] | None = None,
    ) -> Rule:
        """Make the next ``times`` matching calls wait until ``until`` is set, then proceed
        (combine with :meth:`fail` for a call that hangs and then fails)."""
        return self._add(Rule("hang", method, when, times, until=until))

    def before(
        self,
        method: str,
        hook: Callable[[Call], object],
        *,
        times: int | None = None,
        when: Callable[[Call], bool] | None = None,
    ) -> Rule:
        """Run ``hook(call)`` before each matching call reaches the store (an exception from
        the hook is raised to the caller, and the call is not made)."""
        return self._add(Rule("before", method, when, times, hook=hook))

    def after(
        self,
        method: str,
        hook: Callable[[Call, object], object],
        *,
        times: int | None = None,
        when: Callable[[Call], bool] | None = None,
    ) -> Rule:
        """Run ``hook(call, result)`` after each matching call returned from the store."""
        return self._add(Rule("after", method, when, times, hook=hook))

    def clear(self) -> None:
        """Forget every rule: the store behaves normally again."""
        with self._lock:
            self._rules.clear()

    def _add(self, rule: Rule) -> Rule:
        if rule.method not in METHODS:
            raise ValueError(f"unknown store method {rule.method!r}; one of {METHODS}")
        if rule.remaining is not None and rule.remaining < 1:
            raise ValueError(f"times must be a positive count or None, got {rule.remaining}")
        with self._lock:
            self._rules.append(rule)
        return rule

    # ------------------------------------------------------------------ the injection

    def _take(self, call: Call) -> tuple[list[Rule], Rule | None, Rule | None, list[Rule]]:
        """The rules this call takes, all at once: before hooks, a hang, a fault, after hooks."""
        befores: list[Rule] = []
        afters: list[Rule] = []
        hang: Rule | None = None
        fault: Rule | None = None
        with self._lock:
            for rule in self._rules:
                if not rule.matches(call):
                    continue
                if rule.kind == "before":
                    befores.append(rule)
                elif rule.kind == "after":
                    afters.append(rule)
                elif rule.kind == "hang":
                    if hang is not None:
                        continue
                    hang = rule
                elif fault is None:
                    fault = rule
                else:
                    continue
                rule.take()
        return befores, hang, fault, afters

    def _call(self, method: str, args: dict[str, Any], perform: Callable[[], Any]) -> Any:
        call = Call(method, args)
        fault, afters = self._enter(call)
        result = perform()
        self._leave(call, fault, afters, result)
        return result

    def _enter(self, call: Call) -> tuple[Rule | None, list[Rule]]:
        """Take the call's rules, run its before hooks and hang; raise a fault that loses the
        request.  Returns what :meth:`_leave` needs once the inner call returned."""
        befores, hang, fault, afters = self._take(call)
        for rule in befores:
            assert rule.hook is not None
            rule.hook(call)
        if hang is not None:
            assert hang.until is not None
            hang.until.wait()
        if fault is not None and not fault.applied:
            raise _error(fault, call, "before it reached the store")
        return fault, afters

    def _leave(self, call: Call, fault: Rule | None, afters: list[Rule], result: object) -> None:
        if fault is not None:
            raise _error(fault, call, "after the store applied it (the reply was lost)")
        for rule in afters:
            assert rule.hook is not None
            rule.hook(call, result)

    # ------------------------------------------------------------------ the Store interface

    def create_table(self, name: str, families: Sequence[FamilySpec]) -> None:
        self._call(
            "create_table",
            {"name": name, "families": families},
            lambda: self.inner.create_table(name, families),
        )

    def drop_table(self, name: str) -> None:
        self._call("drop_table", {"name": name}, lambda: self.inner.drop_table(name))

    def list_tables(self) -> list[str]:
        tables: list[str] = self._call("list_tables", {}, self.inner.list_tables)
        return tables

    def table_families(self, name: str) -> list[FamilySpec]:
        families: list[FamilySpec] = self._call(
            "table_families", {"name": name}, lambda: self.inner.table_families(name)
        )
        return families

    def read_rows(
        self,
        table: str,
        rows: Sequence[bytes],
        columns: Sequence[Column] | None = None,
        families: Sequence[str] | None = None,
        *,
        before: int | None = None,
        min_version: int = 0,
        max_versions: int = 1,
    ) -> dict[bytes, RowCells]:
        args = {
            "table": table,
            "rows": rows,
            "columns": columns,
            "families": families,
            "before": before,
            "min_version": min_version,
            "max_versions": max_versions,
        }
        result: dict[bytes, RowCells] = self._call(
            "read_rows",
            args,
            lambda: self.inner.read_rows(
                table,
                rows,
                columns,
                families,
                before=before,
                min_version=min_version,
                max_versions=max_versions,
            ),
        )
        return result

    def read_cells(
        self,
        table: str,
        cells: Sequence[tuple[bytes, Column]],
        *,
        before: int | None = None,
    ) -> dict[bytes, RowCells]:
        # A read like read_rows for the rules (same method name; ``rows`` and ``columns``
        # are the distinct rows and columns of ``cells``), forwarded as itself.
        rows, columns = split_cells(cells)
        args = {
            "table": table,
            "rows": rows,
            "columns": columns,
            "cells": cells,
            "families": None,
            "before": before,
            "min_version": 0,
            "max_versions": 1,
        }
        result: dict[bytes, RowCells] = self._call(
            "read_rows", args, lambda: self.inner.read_cells(table, cells, before=before)
        )
        return result

    def scan(
        self, table: str, family: str, options: ScanOptions | None = None
    ) -> Iterator[tuple[bytes, dict[bytes, Version]]]:
        # A generator: nothing is checked until the caller starts iterating, as with a real
        # scanner.  The whole scan is one call for the rules: an ``applied`` fault raises once
        # every row was delivered; after hooks get ``None``.
        call = Call("scan", {"table": table, "family": family, "options": options})
        fault, afters = self._enter(call)
        yield from self.inner.scan(table, family, options)
        self._leave(call, fault, afters, None)

    def put(self, table: str, puts: Sequence[Put]) -> None:
        if not self.split_puts:
            self._call("put", {"table": table, "puts": puts}, lambda: self.inner.put(table, puts))
            return
        groups: dict[tuple[bytes, int], list[Put]] = {}
        for p in puts:
            groups.setdefault((p.row, p.version), []).append(p)
        for group in groups.values():
            perform = partial(self.inner.put, table, group)
            self._call("put", {"table": table, "puts": group}, perform)

    def compare_and_set(
        self,
        table: str,
        row: bytes,
        family: str,
        qualifier: bytes,
        expected: bytes | None,
        new: bytes,
    ) -> bool:
        return self._compare_and_set(table, CompareAndSet(row, family, qualifier, expected, new))

    def compare_and_set_many(
        self, table: str, items: Sequence[CompareAndSet], puts: Sequence[Put] = ()
    ) -> list[bool]:
        """As :meth:`Store.compare_and_set_many`'s default (the puts first, then one
        ``compare_and_set`` per item), except that where the inner store has conditional
        puts an item carrying ``then_put`` goes to it whole, so its puts land with it or
        not at all."""
        if not self.conditional_puts:
            return super().compare_and_set_many(table, items, puts)  # refuses then_put
        if puts:
            self.put(table, puts)
        return [self._compare_and_set(table, item) for item in items]

    def _compare_and_set(self, table: str, item: CompareAndSet) -> bool:
        """One ``compare_and_set`` call for the rules (``then_put`` among its arguments)."""
        args = {
            "table": table,
            "row": item.row,
            "family": item.family,
            "qualifier": item.qualifier,
            "expected": item.expected,
            "new": item.new,
            "then_put": item.then_put,
        }

        def perform() -> bool:
            if item.then_put:
                [applied] = self.inner.compare_and_set_many(table, [item])
                return applied
            return self.inner.compare_and_set(
                table, item.row, item.family, item.qualifier, item.expected, item.new
            )

        applied: bool = self._call("compare_and_set", args, perform)
        return applied

    def delete_versions(self, table: str, deletes: Sequence[Delete]) -> None:
        self._call(
            "delete_versions",
            {"table": table, "deletes": deletes},
            lambda: self.inner.delete_versions(table, deletes),
        )

    def compact_deletes(self, table: str) -> int:
        dropped: int = self._call(
            "compact_deletes", {"table": table}, lambda: self.inner.compact_deletes(table)
        )
        return dropped

    def close(self) -> None:
        self.inner.close()


def _error(rule: Rule, call: Call, where: str) -> BaseException:
    spec = rule.error
    if isinstance(spec, BaseException):
        return spec
    message = f"injected fault: {call.method} failed {where}"
    if spec is None:
        return StoreUnavailableError(message)
    return spec(message)
