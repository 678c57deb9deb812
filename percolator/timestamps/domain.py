"""Which oracle a deployment takes its timestamps from: its *timestamp domain*.

Timestamps of two oracles are not ordered with each other.  A client of one deployment
that drew its timestamps from another oracle than the deployment's other clients (an
oracle URL copied from another deployment, one client left on the local oracle) would break
snapshot isolation without a single error.  So a deployment is bound to one domain, and
every client checks it:

* a timestamp domain is named by the deployment id (:func:`percolator.layout.deployment_id`)
  of the store whose oracle record issues the timestamps: the store's own for the local
  oracle and for an oracle server on the store; another store's for an oracle server
  running on that one (several deployments may share one oracle service, as long as each
  uses only it);
* the first timestamp a client draws binds the store (meta row ``deployment``, qualifier
  ``ts``, JSON ``{"v": 1, "domain": ID, "source": TEXT}``, compare-and-set from absent): the
  local oracle binds before its first reservation, the gRPC client with the first range it
  receives, each of which carries the domain it was issued in.  A store whose own oracle
  record already exists (it issued timestamps before the binding existed) is bound to
  another domain only if the binding client's first timestamp from it is above that
  record's high-water mark, else to its own (:func:`bind_timestamp_domain`);
* a client checks an existing binding when it connects (:func:`check_timestamp_domain`,
  one read, writes nothing), so a client given the wrong oracle is refused before it
  writes anything; and every range the gRPC client receives is checked against it, so an
  address that comes to serve another domain (a server replaced at the same address) is
  refused too.  Both raise :class:`~percolator.errors.OracleError` naming both oracles.
  Commands that only read and draw no timestamp bind nothing.

Moving a deployment to another oracle is not supported: the new oracle would first have to
issue above everything the old one issued.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from percolator.errors import OracleError, StoreError, TableNotFoundError
from percolator.layout import (
    DEPLOYMENT_ROW,
    META_FAMILY,
    META_TABLE,
    deployment_id,
    meta_set_once,
)
from percolator.store.base import Store
from percolator.timestamps.record import OracleRecordRegister

DOMAIN_QUALIFIER = b"ts"
#: the source recorded for the store's own oracle (local, or a server on the store)
OWN_ORACLE = "the store's own oracle (in-process, or an oracle server on this store)"


@dataclass(frozen=True)
class Binding:
    domain: str
    source: str

    def encode(self) -> bytes:
        return json.dumps({"v": 1, "domain": self.domain, "source": self.source}).encode()

    @staticmethod
    def decode(raw: bytes) -> Binding:
        try:
            doc = json.loads(raw)
            if doc.get("v") != 1:
                raise ValueError(f"unknown format {doc.get('v')!r}")
            return Binding(str(doc["domain"]), str(doc["source"]))
        except (ValueError, KeyError, AttributeError) as exc:
            raise StoreError(f"the store's timestamp-domain record is unreadable ({exc})") from None


def read_binding(store: Store) -> Binding | None:
    """The store's binding, None if no client has bound it yet."""
    column = (META_FAMILY, DOMAIN_QUALIFIER)
    try:
        versions = store.read_row(META_TABLE, DEPLOYMENT_ROW, columns=[column]).get(column)
    except TableNotFoundError:  # a store nothing was written to yet
        return None
    return Binding.decode(versions[0][1]) if versions else None


def _refuse(store: Store, bound: Binding, domain: str, source: str) -> OracleError:
    return OracleError(
        f"store {store.url!r} takes its timestamps from {bound.source} (timestamp domain "
        f"{bound.domain}); this client was given {source} (domain {domain}). Timestamps of "
        "two oracles are not ordered with each other, so snapshot isolation would break: "
        "use the oracle the store's other clients use"
    )


def check_timestamp_domain(store: Store, domain: str | None, source: str = OWN_ORACLE) -> None:
    """Raise OracleError if ``store`` is bound to another domain than ``domain`` (None: the
    store's own).  Writes nothing; an unbound store passes (its first timestamp binds it)."""
    bound = read_binding(store)
    if bound is None:
        return
    if domain is None:
        domain = deployment_id(store)  # exists: binding made it
    if bound.domain != domain:
        raise _refuse(store, bound, domain, source)


def bind_timestamp_domain(
    store: Store, domain: str | None, source: str = OWN_ORACLE, *, first_ts: int = 0
) -> None:
    """Bind ``store`` to timestamp domain ``domain`` (None: the store's own; ``source``
    describes the oracle) if it is not bound yet; raise OracleError if it is bound to
    another (module docstring).  Idempotent and race-safe: concurrent first binders agree
    on one binding.

    ``first_ts``: the lowest timestamp the binding client received from ``domain``'s
    oracle.  A store whose own oracle issued timestamps before is bound to ``domain`` only
    if ``first_ts`` is above everything its own oracle can have issued (the high-water
    mark of its record): then no earlier commit lies above the new oracle's timestamps,
    which is what a store that used its own oracle before this check existed, or drew one
    local timestamp by mistake, needs to move to a service safely.  Otherwise it is bound
    to its own."""
    own = deployment_id(store)  # creates the meta table and the id if needed
    wanted = own if domain is None else domain

    def first_binding() -> bytes:
        if wanted != own:
            record = OracleRecordRegister(store).read().record
            if record is not None and first_ts <= record.high_water:
                # Its own oracle may have issued timestamps above the new oracle's: the
                # store stays with its own.
                return Binding(own, OWN_ORACLE + ", which has issued its timestamps").encode()
        return Binding(wanted, source).encode()

    bound = Binding.decode(meta_set_once(store, DEPLOYMENT_ROW, DOMAIN_QUALIFIER, first_binding))
    if bound.domain != wanted:
        raise _refuse(store, bound, wanted, source)
