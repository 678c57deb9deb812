"""Checks run inside a container of the compose deployment (the example image: the engine and
the example pipeline), fed on stdin by tests/deploy/compose_run.py:

    podman exec -i CONTAINER python - ACTION [ARGS] < tests/deploy/stack_check.py

The store and the oracle group come from the container's environment (PERCOLATOR_STORE,
PERCOLATOR_ORACLE), as for every service.  Each action prints one JSON object on stdout and
exits 0, or exits 1 with the reason on stderr.

    roles               every oracle's role ({"oracle:7070": "active", ...})
    write ROUND         round 1: 120 generated documents and 20 notes; round N > 1: changes
                        to both (edits, deletes, new documents) - through the engine
    check [TIMEOUT_S]   waits until no notification is pending on any observed column, then
                        compares the derived tables with the reference computed from the
                        stored documents, and every note's word count with its text
                        (the caller checks how many notes there are)

Only the standard library, the engine and the example package: it runs in the image as is.
"""

from __future__ import annotations

import json
import os
import sys
import time

from docpipeline import corpus, reference
from percolator.observers.parking import pending

import percolator

NOTES, STATS = "notes", "note_stats"
OBSERVED = [
    ("documents", "body"),
    ("documents", "links"),
    ("doc_clusters", "canonical"),
    (NOTES, "text"),
]


def connect() -> percolator.Client:
    return percolator.connect(
        os.environ["PERCOLATOR_STORE"], oracle=os.environ["PERCOLATOR_ORACLE"]
    )


def roles() -> dict[str, object]:
    from percolator.oracle.client import GrpcOracleClient
    from percolator.oracle.proto_gen import oracle_pb2

    url = os.environ["PERCOLATOR_ORACLE"]
    addresses = url.split("://", 1)[1].split(",")
    client = GrpcOracleClient(addresses, rpc_timeout_s=3.0)
    found: dict[str, object] = {}
    try:
        for address in addresses:
            try:
                info = client.info(address)
                found[address] = {
                    "role": oracle_pb2.Role.Name(info.role).removeprefix("ROLE_").lower(),
                    "epoch": info.epoch,
                }
            except Exception as exc:
                found[address] = {"role": "unreachable", "error": type(exc).__name__}
    finally:
        client.close()
    return found


def _note_text(index: int, round_: int) -> bytes:
    words = index + 1 + (round_ if round_ > 1 and index % 2 == 0 else 0)
    return " ".join(f"w{round_}x{n}" for n in range(words)).encode()


def write(round_: int) -> dict[str, object]:
    client = connect()
    started = time.monotonic()
    try:
        docs = corpus.generate(120, seed=1)
        if round_ == 1:
            changes: list[corpus.Change | corpus.Document] = list(docs)
        else:
            changes = list(corpus.mutate(docs, fraction=0.2, seed=round_))
        written = corpus.write_documents(client, changes)
        client.create_table(NOTES)
        notes = range(20) if round_ == 1 else range(0, 20, 2)

        def put(txn: percolator.Transaction) -> None:
            for index in notes:
                txn.set(NOTES, f"note-{index:02d}", "text", _note_text(index, round_))

        client.run(put)
        return {
            "documents_written": written,
            "notes_written": len(notes),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        client.close()


def check(timeout_s: float) -> dict[str, object]:
    client = connect()
    started = time.monotonic()
    try:
        deadline = started + timeout_s
        tables = set(client.list_tables())
        while True:
            waiting = [
                f"{t}:{c}" for t, c in OBSERVED if t in tables and pending(client, t, [c], limit=1)
            ]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"not quiet after {timeout_s:.0f} s: pending on {waiting}")
            time.sleep(0.5)
        quiet_s = time.monotonic() - started
        with client.snapshot() as snap:
            documents = reference.read_documents(snap)
            problems = reference.diff(reference.compute(documents), reference.read_derived(snap))
            notes = dict(snap.scan(NOTES, columns=["text"])) if NOTES in tables else {}
            stats = dict(snap.scan(STATS, columns=["words"])) if STATS in tables else {}
        if problems:
            raise SystemExit("derived tables differ from the reference:\n" + "\n".join(problems))
        wrong = [
            row.decode()
            for row, cells in notes.items()
            if stats.get(row, {}).get("words") != str(len(cells["text"].split())).encode()
        ]
        if wrong:
            raise SystemExit(f"note_stats:words wrong for {wrong}")
        return {
            "quiet_after_s": round(quiet_s, 1),
            "documents": len(documents),
            "derived_equal_reference": True,
            "notes_counted": len(notes),
        }
    finally:
        client.close()


def main(argv: list[str]) -> int:
    action = argv[0] if argv else ""
    if action == "roles":
        result = roles()
    elif action == "write" and len(argv) == 2 and argv[1].isdigit() and int(argv[1]) >= 1:
        result = write(int(argv[1]))
    elif action == "check":
        result = check(float(argv[1]) if len(argv) > 1 else 300.0)
    else:
        print("usage: stack_check.py roles | write ROUND | check [TIMEOUT_S]", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
