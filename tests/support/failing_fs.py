"""A file system that fails under a real memstaged: full (ENOSPC), made read-only by
``trigger_fs_error`` (EROFS) or shut down by ``EXT4_IOC_SHUTDOWN`` (EIO), and mended again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import subprocess
from pathlib import Path

#: ``_IOR('X', 125, __u32)``: shut an ext4 down; every later write and fsync fails with EIO.
EXT4_IOC_SHUTDOWN = (2 << 30) | (4 << 16) | (ord("X") << 8) | 125
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


class Broken:
    """Where the decision log lives, how to make it unwritable, and how to mend it."""

    def __init__(self, kind: str, root: Path, device: str | None = None) -> None:
        self.kind = kind
        self.root = root
        self.device = device
        self.log = root / "decisions.jsonl"
        self.filler = root / "filler"

    @property
    def errno_name(self) -> str:
        return {"enospc": "ENOSPC", "erofs": "EROFS", "eio": "EIO"}[self.kind]

    def break_it(self) -> None:
        if self.kind == "enospc":
            self._fill()
        elif self.kind == "erofs":
            assert self.device is not None
            Path(f"/sys/fs/ext4/{self.device}/trigger_fs_error").write_text("1\n")
        else:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
            finally:
                os.close(fd)

    def _fill(self) -> None:
        """Take every byte left; the log's last page is first padded with a line of its own,
        so that no event fits in what is left of it."""
        if self.log.exists():
            room = -self.log.stat().st_size % 4096
            if room:
                room += 4096 if room < 64 else 0  # a padding event takes some 30 bytes
                bare = len(json.dumps({"event": "test_padding", "pad": ""})) + 1
                line = json.dumps({"event": "test_padding", "pad": "p" * (room - bare)}) + "\n"
                with self.log.open("ab") as fh:
                    fh.write(line.encode())
        take_every_byte(self.filler)

    def mend(self) -> None:
        """Room again, or the failed ext4 lazily unmounted: the path is writable again."""
        if self.kind == "enospc":
            self.filler.unlink()
        else:
            subprocess.run(["umount", "-l", str(self.root)], check=True)


def take_every_byte(filler: Path) -> None:
    """Fill the file system of ``filler`` with it, to its last byte."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"f" * 1024):
            pass
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)
