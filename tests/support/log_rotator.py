"""A hostile rotator of a decision log, for issue 19 item 6's test (run as its own process).

It rotates the log as memstaged does (an exclusive ``flock`` on the file it renames, the path
checked under it), as fast as it can, keeping one backup: ``<log>`` becomes ``<log>.1``,
replacing the previous ``<log>.1``. That one is first copied, under the same lock, into the
archive: so every line written into a file while that file was reachable is kept somewhere,
and a line missing at the end was written into a file already rotated away (and deleted).

Usage: ``python log_rotator.py LOG ARCHIVE_DIR STOP_FILE MOST``; prints how many rotations it
did. Bounded: it stops at MOST rotations, or when STOP_FILE exists.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time


def rotate_once(log: str, archive: str, number: int) -> bool:
    """One rotation of a non-empty log under its lock; False when there was nothing to do."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = os.stat(log)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (mine.st_dev, mine.st_ino) or st.st_size == 0:
            return False  # rotated meanwhile by someone else, or nothing in it yet
        try:
            with open(f"{log}.1", "rb") as old:
                data = old.read()
        except FileNotFoundError:
            data = None
        if data is not None:
            with open(os.path.join(archive, f"{number:06d}.jsonl"), "wb") as out:
                out.write(data)
        os.rename(log, f"{log}.1")
        return True
    finally:
        os.close(fd)  # releases the lock


def main(argv: list[str]) -> int:
    log, archive, stop, most = argv[0], argv[1], argv[2], int(argv[3])
    rotations = 0
    while rotations < most and not os.path.exists(stop):
        if rotate_once(log, archive, rotations):
            rotations += 1
        else:
            time.sleep(0.001)  # nothing to rotate yet: let the writers write
    print(rotations)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
