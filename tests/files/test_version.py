"""One version of a staging file (:mod:`memstaged.files.version`): opened safely and read whole,
with as few calls as a decision needs (issue 14 item 3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.documents import staging_doc, write


def test_a_file_is_read_with_one_read_call_and_its_bytes_are_whole(
    project: Path, memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14 item 3 (calls per decision): a staging file is read by one ``read`` (the end is
    known from a short read once ``fstat``'s size is in, not from a second read returning
    nothing), and the bytes read are exactly the file's, small or larger than a chunk."""
    from memstaged.files import safe_open
    from memstaged.files.version import Version, read_version

    staging = memory_dir / "staging"
    small = write(staging / "small.json", staging_doc(project, "small"))
    big = write(staging / "big.json", b" " * 200_000 + small)
    empty = write(staging / "empty.json", b"")
    reads: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    staging_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name, data in (("small.json", small), ("big.json", big), ("empty.json", empty)):
            reads.clear()
            version = read_version(staging_fd, name, 8 << 20)
            assert isinstance(version, Version)
            with version:
                assert version.data == data
                assert len(reads) == 1, name
                assert safe_open.read_fd_at(version.fd, len(data) + 1) == data
    finally:
        os.close(staging_fd)
