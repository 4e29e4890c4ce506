"""The seen cache (:mod:`memstaged.run.seen_cache`): what ``--once`` and the daemon remember of
the files they decided, kept across runs.

That it is dropped whenever the code of the decision changes is in
``tests/system/test_seen_fingerprint.py`` (an edited copy of the package, run anew)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("plain_output")


def test_seen_cache_keeps_names_that_are_not_utf8(tmp_path: Path) -> None:
    """Issue 13 item 1: the msgpack seen cache stores a non-UTF-8 name by its bytes and gives
    back the same string (it raised UnicodeEncodeError: "surrogates not allowed")."""
    from memstaged.run.seen_cache import SeenCache

    name = os.fsdecode(b"caf\xe9\x1b.json")
    cache = SeenCache.load(tmp_path, "/m", "/p", "k")
    cache.remember(name, (1, 2, 3, 4, 5), "valid")
    cache.remember("plain.json", (1, 3, 3, 4, 5), "foreign")
    cache.save()
    again = SeenCache.load(tmp_path, "/m", "/p", "k")
    assert again.entries == {
        name: ((1, 2, 3, 4, 5), "valid"),
        "plain.json": ((1, 3, 3, 4, 5), "foreign"),
    }
