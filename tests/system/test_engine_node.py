"""The whole engine's validity held to a JavaScript implementation of SPEC 2 (contract v2; issue
11 item 2), run in Node.js on seeded corpora of staging files.

The engine's own tests under contract v2 (R5, R6, blank context keys, Node's reading of bytes,
any depth, bounded records) are in ``tests/core/test_engine.py``; its memory on 10,000 empty
candidates, in ``tests/system/test_bounds.py``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from support.date_corpus import corpus
from support.documents import DELETE
from support.engine import (
    PROJECT,
    context,
    encode,
    patched,
    staging,
)
from support.node_oracle import Node

from memstaged.core.decide import BOM, Decision, decide

VALID, REPAIRED, QUARANTINED, FOREIGN = (
    Decision.VALID,
    Decision.REPAIRED,
    Decision.QUARANTINED,
    Decision.FOREIGN,
)


# -- the whole engine against SPEC 2 in JavaScript ----------------------------------------------


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One Node.js for the whole module."""
    js = Node()
    yield js
    js.close()


SPEC_FILES = [
    staging(),
    staging(schemaVersion=1.0),
    staging(schemaVersion="1"),
    staging(schemaVersion=True),
    staging(session_id="\u3000\ufeff"),
    staging(session_id="\x1c"),
    staging(produced_at="2026-02-30"),
    staging(produced_at="1"),
    staging(produced_at="foo 2026"),
    staging(produced_at="Wed, 10 Jun 26 10:00:00 GMT"),
    staging(produced_at="2026-06-10T10:00:00+0200"),
    staging(produced_at="20260110T100000Z"),
    staging(produced_at="2026-01-10T10:00:00,5Z"),
    staging(produced_at="2026-W01-1"),
    staging(produced_at="hello"),
]


def _files(seed: int, count: int) -> list[bytes]:
    """Staging files of every kind: SPEC's, mutated, with odd timestamps and odd bytes."""
    rng = random.Random(seed)
    stamps = corpus(seed, count)
    out = [encode(d) for d in SPEC_FILES]
    out.append(encode(staging()).replace(b"1.0", b"1e0"))
    keys = [
        ("schemaVersion",), ("session_id",), ("project_root",), ("candidates",),
        ("candidates", "lessons", 0, "triggers"), ("candidates", "preferences", 0, "text"),
        ("candidates", "decisions", 0, "source_evidence"), ("candidates", "domain"),
        ("candidates", "lessons", 0, "source_evidence", "discussion_note_ids"),
    ]  # fmt: skip
    values = [DELETE, "", " ", "\u00a0x", None, [], {}, 1, 1.0, True, "1", [{}], [1e400], ["m"]]
    for i in range(count):
        doc = staging(produced_at=stamps[i] if i % 2 else "2026-01-01T00:00:00Z")
        for _ in range(rng.randint(0, 2)):
            try:
                doc = patched(doc, (rng.choice(keys), rng.choice(values)))
            except (KeyError, IndexError, TypeError):
                pass  # the path is gone after an earlier change

        data = encode(doc)
        roll = rng.random()
        if roll < 0.05:
            data = BOM + data
        elif roll < 0.1:
            data = data.replace(b"Prefer", b"Pr\xffefer")
        out.append(data)
    return out


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_engine_validity_agrees_with_javascript(node: Node, zone: str) -> None:
    """Issue 11 "done when": on SPEC's examples and 3,000 generated files (timestamps from the
    Date.parse corpus, mutated fields, BOMs, invalid bytes) a file memstaged calls valid is one
    SPEC 2 in JavaScript accepts and vice versa, and every rewrite it makes is accepted."""
    from support.node_oracle import local_zone

    files = _files(11, 3000)
    with local_zone(node, zone):
        verdicts = [decide(data, context()) for data in files]
        accepts = node.ask_bytes("valid", files)
        rewrites = [v.new_bytes for v in verdicts if v.decision is REPAIRED]
        accepts_rewrite = node.ask_bytes("valid", [b for b in rewrites if b is not None])
    wrong = [
        f"input {data!r}: memstaged {v.decision.value} {v.reasons[:2]}, node valid={js}"
        for data, v, js in zip(files, verdicts, accepts, strict=True)
        if (v.decision is VALID) != js and v.decision is not FOREIGN
    ]
    assert wrong == [], "\n".join(wrong[:20])
    assert all(accepts_rewrite), "a rewrite that JavaScript rejects"
    counts = {d: sum(v.decision is d for v in verdicts) for d in Decision}
    print(zone, counts)
    assert counts[VALID] > 150 and counts[REPAIRED] > 100 and counts[QUARANTINED] > 300
    assert PROJECT  # files name this project
