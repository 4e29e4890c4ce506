"""Text safe on a terminal (:mod:`memstaged.safe_text`): names escaped reversibly, and the
repairs of a decision said in one line."""

from __future__ import annotations

import os

import pytest
from support.shown_names import unquote

from memstaged import safe_text

pytestmark = pytest.mark.usefixtures("plain_output")


def test_repairs_are_named_by_rule_r5_last_escaped() -> None:
    """Issue 13 (a repaired line says which repair): the one-line form groups the repairs by
    rule in the order seen, R5 (an added category) last, at most three places a rule; what it
    prints is escaped, and a hand-edited log with a list for a rule prints, not raises."""
    from memstaged import safe_text

    items = [{"rule": "R5", "where": c} for c in ("a", "b", "c", "d")]
    items += [{"rule": "R1", "where": f"candidates.lessons[{i}].triggers"} for i in range(2)]
    items.append({"rule": "R3", "where": "produced_at\x1b[2J"})
    assert safe_text.repairs(items) == (
        "R1 at candidates.lessons[0].triggers, candidates.lessons[1].triggers; "
        "R3 at produced_at\\x1b[2J; R5 at a, b, c (+1 more)"
    )
    assert safe_text.repairs([{"rule": ["R1"], "where": "x"}]) == "['R1'] at x"


@pytest.mark.parametrize(
    "raw",
    [
        b"caf\xe9.json",
        b'"quoted".json',
        b"back\\slash.json",
        "rtl\u202eexe.json".encode(),
        b"ok.json",
    ],
)
def test_shown_names_are_reversible(raw: bytes) -> None:
    """SPEC 6 "escaped reversibly": what display.name shows gives the bytes back, and a name
    that needs nothing is shown as it is."""
    shown = safe_text.name(os.fsdecode(raw))
    assert shown.isprintable()
    assert os.fsencode(unquote(shown)) == raw
    if raw == b"ok.json":
        assert shown == "ok.json"
