"""The one error tree of the project.

Every error the project raises derives from :class:`PercolatorError`.  Each carries a
``retryable`` flag: a retryable error means "the same work, re-run from the start in a new
transaction, may succeed".  It never means "re-send the same writes".

Transport errors (Thrift, sockets, gRPC) are translated at the edge, in the store backends
and the oracle client, so callers only ever see the types below.
"""

from __future__ import annotations


class PercolatorError(Exception):
    """Base class of every error raised by the project."""

    retryable: bool = False


# --------------------------------------------------------------------------- configuration


class ConfigError(PercolatorError):
    """Bad configuration or arguments: a malformed URL, an unknown option, a wrong type."""


class InvalidArgumentError(ConfigError, ValueError):
    """An argument is of the wrong type or value; raised before anything is written."""


# --------------------------------------------------------------------------- storage


class StoreNotFoundError(ConfigError):
    """A read-only command was pointed at a store that does not exist (it never creates one)."""


class StoreError(PercolatorError):
    """The store failed an operation (the server reported an error)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached (connection refused, dropped, timed out).

    The operation may or may not have been applied when the connection broke mid-call;
    callers that care (the commit point) must treat it as undetermined.
    """

    retryable = True


class TableNotFoundError(StoreError):
    """The named table does not exist."""

    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} does not exist")
        self.table = table


class TableExistsError(StoreError):
    """A table with that name already exists."""

    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} already exists")
        self.table = table


# --------------------------------------------------------------------------- transactions


class TransactionError(PercolatorError):
    """Base for errors of the transaction protocol."""


class ConflictError(TransactionError):
    """A write-write conflict or a lock that could not be resolved in time.

    Retryable: the whole transaction function may be re-run with a new ``start_ts``.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        table: str = "",
        row: bytes = b"",
        column: str = "",
        start_ts: int = 0,
        conflict_ts: int = 0,
    ) -> None:
        details = (
            f" (table={table!r}, row={row!r}, column={column!r}, "
            f"start_ts={start_ts}, conflicting_ts={conflict_ts})"
        )
        super().__init__(message + details)
        self.table = table
        self.row = row
        self.column = column
        self.start_ts = start_ts
        self.conflict_ts = conflict_ts


class LockWaitTimeoutError(ConflictError):
    """A reader backed off for its whole bound on a live lock of another transaction."""


class TransactionAbortedError(TransactionError):
    """The transaction was rolled back (by itself or by another client resolving it)."""

    retryable = True


class UndeterminedCommitError(TransactionError):
    """The outcome of the commit point is unknown (for example the connection broke during
    the primary commit).  The transaction may have committed or not; a later read shows
    the truth.  Never retried automatically."""

    retryable = False


class TransactionStateError(TransactionError):
    """An operation was attempted in the wrong state (for example a write after commit)."""


class SafePointError(TransactionError):
    """A read below the garbage-collection safe point: the versions it needs may be gone."""


# --------------------------------------------------------------------------- oracle


class OracleError(PercolatorError):
    """The timestamp oracle failed or returned something impossible."""


class OracleUnavailableError(OracleError):
    """No oracle could be reached."""

    retryable = True


class TimestampRegressionError(OracleError):
    """The oracle returned a timestamp lower than one this client already saw."""


class FencedError(OracleError):
    """This oracle lost its lease or its epoch: it must stop serving at once."""


def describe_plugin_error(exc: BaseException) -> str:
    """``Type: message`` on one line, for an exception raised by plugin code (a command or
    an observer plugin).  Plugin code that calls ``sys.exit()`` is a broken plugin like any
    other: the caller reports it instead of ending with the plugin's exit status."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: called sys.exit({exc.code!r})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
