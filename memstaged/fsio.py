"""File-system primitives with the guarantees SPEC sections 5 and 6 ask for.

Everything works relative to directory file descriptors opened with ``O_NOFOLLOW``, so a
``staging/`` or ``deadletter/`` replaced by a symbolic link is refused rather than followed, and a
name is never resolved twice along a path that could change in between.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import msgspec

TEMP_PREFIX: Final = ".memstaged~"
CHUNK: Final = 1 << 20
_RENAME_NOREPLACE: Final = 1
_RENAME_EXCHANGE: Final = 2
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int


class Identity(msgspec.Struct, frozen=True, array_like=True):
    """What tells two versions of a file apart without reading them."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _rename2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    if _renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2 {src} -> {dst}: {os.strerror(err)}")


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap two names atomically: the displaced version is handed back, never overwritten."""
    _rename2(dir_fd, a, dir_fd, b, _RENAME_EXCHANGE)


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Rename, failing with ``EEXIST`` instead of replacing what is at ``dst``."""
    _rename2(src_dir, src, dst_dir, dst, _RENAME_NOREPLACE)


def open_dir(path: str, dir_fd: int | None = None, *, create: bool = False) -> int:
    """Open a directory without following a link at its last component; create it 0700."""
    try:
        return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass  # created meanwhile by another process: open what is there
    return os.open(path, _DIR_FLAGS, dir_fd=dir_fd)


@contextmanager
def opened_dir(path: str, dir_fd: int | None = None, *, create: bool = False) -> Iterator[int]:
    fd = open_dir(path, dir_fd, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(fd: int) -> None:
    os.fsync(fd)


def temp_name(role: str, for_name: str = "") -> str:
    """A name no writer uses: hidden, memstaged's prefix, the role, the target name, random."""
    return f"{TEMP_PREFIX}{role}~{for_name[:200]}~{secrets.token_hex(6)}"


def parse_temp_name(name: str) -> tuple[str, str] | None:
    """The role and target name encoded by :func:`temp_name`, or ``None`` for any other name."""
    if not name.startswith(TEMP_PREFIX):
        return None
    parts = name[len(TEMP_PREFIX) :].split("~")
    if len(parts) < 3:
        return None
    return parts[0], "~".join(parts[1:-1])


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_temp(
    dir_fd: int, data: bytes, role: str, for_name: str = "", *, sync: bool = True
) -> str:
    """Write ``data`` to a new temp file in ``dir_fd`` (0600), fsynced unless told otherwise."""
    name = temp_name(role, for_name)
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(dir_fd, name)
        raise
    os.close(fd)
    return name


def copy_to_temp(src_fd: int, dir_fd: int, role: str, for_name: str = "") -> tuple[str, str, int]:
    """Copy a whole file in bounded chunks to a temp file; returns name, sha256 and size."""
    name = temp_name(role, for_name)
    digest = hashlib.sha256()
    size = 0
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        os.lseek(src_fd, 0, os.SEEK_SET)
        while chunk := os.read(src_fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
            write_all(fd, chunk)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quietly(dir_fd, name)
        raise
    os.close(fd)
    return name, digest.hexdigest(), size


def unlink_quietly(dir_fd: int, name: str) -> None:
    """Remove one of memstaged's own temp files; a missing one is already what we want."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class Snapshot(msgspec.Struct, frozen=True):
    """The bytes memstaged read of one file and the identity of the version they came from."""

    identity: Identity
    mtime: float
    data: bytes | None  # None when the file is larger than the limit and was not read


@contextmanager
def open_regular(dir_fd: int, name: str) -> Iterator[tuple[int, os.stat_result]]:
    """Open a regular file without following links and without blocking on a FIFO.

    Raises ``OSError`` with ``ELOOP`` for a link and ``EINVAL`` (our own) for anything that is not
    a regular file, so the caller can log either as ``skipped``.
    """
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        yield fd, st
    finally:
        os.close(fd)


def read_fd(fd: int, size_hint: int, limit: int) -> bytes | None:
    """Read a whole file, or return ``None`` if it turns out to be larger than ``limit``."""
    chunks: list[bytes] = []
    total = 0
    want = max(size_hint, 0) + 1
    while True:
        chunk = os.read(fd, max(want, 65536))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
