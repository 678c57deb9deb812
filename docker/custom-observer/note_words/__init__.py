"""An observer of a column no bundled example watches: ``notes:text``.

For every note whose text changes, ``note_stats:words`` holds the number of words of the
latest text, written in the same transaction as the observer's acknowledgement (so the count
is never ahead of or behind a committed text once the workers are quiet).  A deleted text
deletes the count.  Idempotent: running it twice for the same text writes the same value.
"""

from __future__ import annotations

from percolator.observers.api import Observer

from percolator.client import Client
from percolator.transaction import Transaction

NOTES = "notes"
STATS = "note_stats"


class NoteWords(Observer):
    name = "note-words"
    table = NOTES
    columns = ("text",)

    def setup(self, client: Client) -> None:
        client.create_table(NOTES)
        client.create_table(STATS)

    def process(self, txn: Transaction, row: bytes, column: str) -> None:
        text = txn.get(NOTES, row, "text")
        if text is None:
            txn.delete(STATS, row, "words")
        else:
            txn.set(STATS, row, "words", str(len(text.split())).encode())
