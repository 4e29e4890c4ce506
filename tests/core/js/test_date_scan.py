"""The tokens of ``Date.parse``'s legacy reading (:mod:`memstaged.core.js.date_scan`): long runs
of words glued to symbols are read in bulk, counted rather than timed (issue 19 item 5).

The same reading against V8's, in Node.js itself, is in ``tests/system/test_dateparse_node.py``."""

from __future__ import annotations

import pytest

from memstaged.core.js import date_scan
from memstaged.core.js.date_parse import parse


@pytest.mark.parametrize(
    "text",
    ["a-" * 100_000, "x:" * 100_000, "jan." * 50_000 + " 5 2026", "Ab+)" * 50_000 + "1"],
)
def test_words_glued_to_symbols_are_read_in_bulk(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Issue 19 item 5: words glued to symbols before any number (``"a-"`` repeated) were read
    a token at a time, 20-30 µs per byte (an 8 MB ``produced_at`` held the daemon for minutes).
    The work is counted, not timed: reading 200,000 characters of them makes fewer than 200
    tokens, and the value is the one the token-by-token reading gives (Node agrees with both:
    ``test_bulk_reading_agrees_with_word_by_word_and_node``)."""
    calls = 0
    real = date_scan.Scanner._scan

    def counting(scanner: date_scan.Scanner) -> date_scan.Token:
        nonlocal calls
        calls += 1
        return real(scanner)

    with monkeypatch.context() as patch:
        patch.setattr(date_scan.Scanner, "_scan", counting)
        bulk = parse(text)
    assert calls < len(text) // 1000
    with monkeypatch.context() as patch:
        patch.setattr(date_scan, "_RUN_MIN", 1 << 30)  # no run is long enough: token by token
        assert parse(text) == bulk
