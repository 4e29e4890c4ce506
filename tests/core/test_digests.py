"""The digests memstaged writes into file names and the decision log are SHA-256's, whichever
implementation makes them: CPython's own (the daemon, every short command), OpenSSL's
(``--once`` with a backlog) or ``hashlib``'s on a Python built without the former."""

from __future__ import annotations

import hashlib
import random
import sys

import pytest

from memstaged.core import digests

#: Empty, one block's worth, a length that straddles SHA-256's 64-byte blocks, and more than
#: the 1 MiB chunk in which memstaged hashes a file it copies (``fsio.CHUNK``).
INPUTS = [
    b"",
    b"abc",
    bytes(range(256)) * 3 + b"\xff",
    random.Random(23).randbytes((1 << 20) + 4099),
]


def _both_ways(data: bytes) -> tuple[str, str]:
    """The digest of ``data`` made in one call and fed in chunks of 1 MiB, as fsio does."""
    chunked = digests.sha256()
    for start in range(0, len(data), 1 << 20):
        chunked.update(data[start : start + (1 << 20)])
    return digests.sha256(data).hexdigest(), chunked.hexdigest()


@pytest.mark.parametrize("data", INPUTS, ids=lambda d: f"{len(d)} bytes")
def test_the_digest_is_hashlibs_without_and_with_openssl(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names and log fields hold the same digest as before issue 23 (``hashlib``'s), made by
    the built-in SHA-256 and, after ``for_backlog()`` (``--once``), by OpenSSL's."""
    expected = hashlib.sha256(data).hexdigest()
    assert _both_ways(data) == (expected, expected)
    monkeypatch.setattr(digests, "_make", digests._make)  # for_backlog's choice, undone after
    digests.for_backlog()
    assert _both_ways(data) == (expected, expected)


def test_a_python_without_the_builtin_module_still_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPython configured ``--without-builtin-hashlib-hashes`` (neither ``_sha2`` nor
    ``_sha256`` importable) memstaged still starts and makes the same digests, by hashlib."""
    monkeypatch.setitem(sys.modules, "_sha2", None)
    monkeypatch.setitem(sys.modules, "_sha256", None)
    monkeypatch.setattr(digests, "_make", digests._builtin())
    for data in INPUTS:
        assert _both_ways(data) == (hashlib.sha256(data).hexdigest(),) * 2
