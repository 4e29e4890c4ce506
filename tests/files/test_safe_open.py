"""The safe open (:mod:`memstaged.files.safe_open`): reading a descriptor to its end."""

from __future__ import annotations

import os
from pathlib import Path

from memstaged.files import safe_open


def test_read_fd_reads_on_when_the_file_is_longer_than_fstat_said(tmp_path: Path) -> None:
    """A file that grew after ``fstat`` (a writer appending) is read to its end, not cut at
    the size ``fstat`` gave: the short-read shortcut only ends a read once that size is in."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100_000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert safe_open.read_fd(fd, 10, 1 << 20) == b"x" * 100_000
    finally:
        os.close(fd)
