"""The one safe way to open and read a file memstaged did not write just now.

A file of memstaged's own state (the seen cache, the ack marks), one the user names (the config,
the decision log, a unit), a staging file or a dead-letter file is opened never blocking
(``O_NONBLOCK``: a FIFO or a device put at its name is refused at once), taken only when it is
a regular file, without following a link at its last component unless the user named the path,
and read within a bound (``EFBIG`` beyond, or ``None``): nothing put at a name memstaged reads
can make it wait, follow a link elsewhere, or read without end.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from memstaged.core import digests
from memstaged.files.fsio import CHUNK


def read_small(path: os.PathLike[str] | str, limit: int = 1 << 20) -> bytes:
    """A small file the user or the kernel names (``/proc/<pid>/stat``, a source of the
    package), following links: :func:`read_private` with ``follow``."""
    return read_private(path, limit, follow=True)


def open_append(
    path: os.PathLike[str] | str, explain: Callable[[int], str] = lambda _mode: "not a regular file"
) -> tuple[int, os.stat_result]:
    """Open (or create, 0600) the append-only file at ``path`` (the decision log): never
    blocking on a FIFO, refused (``EINVAL``, ``explain(mode)``) unless a regular file, made 0600
    if it was not. Read-write: the caller reads its last byte. Raises :class:`OSError`."""
    name = os.fspath(path)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(name, flags, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, explain(st.st_mode), name)
        fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND)  # O_NONBLOCK was for the open only
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # a file that was there already is made private too
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def open_nonblocking(path: os.PathLike[str] | str) -> int:
    """A descriptor to read what is at ``path`` (a log the user named), following links and
    never blocking on a FIFO; the caller looks at what it is (``fstat``) before reading.
    Raises :class:`OSError`."""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def hash_fd(fd: int) -> tuple[str, int]:
    """sha256 and size of a whole open file, read in bounded chunks from its start."""
    digest = digests.sha256()
    size = 0
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, CHUNK):
        digest.update(chunk)
        size += len(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest(), size


def open_regular_fd(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """Open a regular file without following links and without blocking on a FIFO.

    Raises ``OSError`` with ``ELOOP`` for a link and ``EINVAL`` (our own) for anything that is not
    a regular file, so the caller can log either as ``skipped``. The caller closes the fd.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_private(
    path: os.PathLike[str] | str, limit: int, *, follow: bool = False, dir_fd: int | None = None
) -> bytes:
    """The whole of a file memstaged keeps for itself (seen cache, ack marks, config), opened
    the one safe way: never blocking (``O_NONBLOCK``: a FIFO or a device put at its name gives
    ``EINVAL`` at once), a regular file only, at most ``limit`` bytes (``EFBIG`` beyond), and a
    link at its last component refused (``ELOOP``) unless ``follow`` (a path the user named).
    ``path`` is relative to ``dir_fd`` when given.

    Raises :class:`OSError` (``FileNotFoundError`` when there is none); the caller says what
    that means for its file.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
        data = read_fd_at(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew since the fstat
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data


@contextmanager
def open_regular(dir_fd: int, name: str) -> Iterator[tuple[int, os.stat_result]]:
    """:func:`open_regular_fd` as a context manager that closes the fd."""
    fd, st = open_regular_fd(dir_fd, name)
    try:
        yield fd, st
    finally:
        os.close(fd)


def read_fd(fd: int, size_hint: int, limit: int) -> bytes | None:
    """Read a whole regular file, or return ``None`` if it turns out to be larger than ``limit``.

    ``size_hint`` is the size ``fstat`` gave. Each read asks for more than is left of that
    size, so a read that returns less once ``size_hint`` bytes are in is the end of the file:
    no second read to see the end (one call less per decided file). Before that
    size, or on a file that grew, it reads on until a read returns nothing, as before.
    """
    chunks: list[bytes] = []
    total = 0
    want = max(size_hint, 0) + 1
    while True:
        ask = max(want - total, 65536)
        chunk = os.read(fd, ask)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
        if len(chunk) < ask and total >= size_hint:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_fd_at(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of an open regular file from its start (``pread``: the offset
    stays). Callers ask one byte more than they expect: a read that returns less, with all
    but that byte in, is the end of the file, and no further read is made to see it."""
    chunks: list[bytes] = []
    offset = 0
    while offset < limit:
        ask = min(limit - offset, CHUNK)
        chunk = os.pread(fd, ask, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        if len(chunk) < ask and offset >= limit - 1:
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
