"""The two locks of SPEC section 5.

* ``canonical-writer.lock``: the reconciler's lock. While a live process holds it, memstaged changes
  nothing in that memory dir. memstaged takes it, create-exclusive, only for the instant it rewrites
  or removes a file. It never deletes a lock it did not create; a lock memstaged created whose
  process is gone would block the reconciler for ever, so it is removed (and that is logged).
* the instance lock: ``flock`` on ``.memstaged.lock`` in the memory dir, so a daemon, a ``--once``
  run and a recovery never work on one memory dir at once, and a killed one never blocks the next.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import msgspec

from memstaged.errors import BusyError
from memstaged.fsio import write_all
from memstaged.timestamps import format_epoch_ms

CANONICAL_LOCK: Final = "canonical-writer.lock"
INSTANCE_LOCK: Final = ".memstaged.lock"
OWNER: Final = "memstaged"
#: An unreadable lock younger than this is taken to be still being written by its holder.
FRESH_SECONDS: Final = 10.0


class LockInfo(msgspec.Struct, frozen=True):
    """What a ``canonical-writer.lock`` says and whether its holder is alive."""

    pid: int | None
    owner: str | None
    alive: bool
    ino: int

    @property
    def ours(self) -> bool:
        return self.owner == OWNER


class LockHeld(Exception):
    """A live process holds ``canonical-writer.lock``."""

    def __init__(self, info: LockInfo) -> None:
        super().__init__(f"canonical-writer.lock is held by live pid {info.pid}")
        self.info = info


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def read_lock(mem_fd: int) -> LockInfo | None:
    """The canonical-writer lock of a memory dir, or ``None`` when there is none."""
    try:
        fd = os.open(CANONICAL_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=mem_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
        return LockInfo(None, None, True, st.st_ino)  # a link: obey it, never follow it
    try:
        st = os.fstat(fd)
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        content: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        content = None
    pid = content.get("pid") if isinstance(content, dict) else None
    owner = content.get("owner") if isinstance(content, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        fresh = time.time() - st.st_mtime < FRESH_SECONDS
        return LockInfo(None, owner if isinstance(owner, str) else None, fresh, st.st_ino)
    return LockInfo(pid, owner if isinstance(owner, str) else None, pid_alive(pid), st.st_ino)


def remove_stale_own_lock(mem_fd: int, info: LockInfo) -> bool:
    """Remove a lock memstaged created whose process is gone, if it is still that same file."""
    if not info.ours or info.alive:
        return False
    st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
    if st.st_ino != info.ino:
        return False
    os.unlink(CANONICAL_LOCK, dir_fd=mem_fd)
    return True


@contextmanager
def canonical_lock(mem_fd: int, on_stale: Any = None) -> Iterator[LockInfo | None]:
    """Hold ``canonical-writer.lock`` for one mutation.

    Yields ``None`` when memstaged took the lock, or the :class:`LockInfo` of a stale lock of
    another owner that is not obeyed (and cannot be taken, since it is not ours to delete).
    Raises :class:`LockHeld` when a live process holds it. ``on_stale(info, removed)`` is called
    for every stale lock seen, so that it is logged.
    """
    body = msgspec.json.encode(
        {
            "pid": os.getpid(),
            "started_at": format_epoch_ms(time.time_ns() // 1_000_000),
            "owner": OWNER,
        }
    )
    for _ in range(3):
        try:
            fd = os.open(
                CANONICAL_LOCK,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=mem_fd,
            )
        except FileExistsError:
            info = read_lock(mem_fd)
            if info is None:
                continue  # released meanwhile
            if info.alive:
                raise LockHeld(info) from None
            removed = remove_stale_own_lock(mem_fd, info)
            if on_stale is not None:
                on_stale(info, removed)
            if removed:
                continue
            yield info
            return
        try:
            write_all(fd, body)
        finally:
            os.close(fd)
        st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
        try:
            yield None
        finally:
            _release(mem_fd, st.st_ino)
        return
    raise LockHeld(LockInfo(None, None, True, 0))


def _release(mem_fd: int, ino: int) -> None:
    st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
    if st.st_ino == ino:
        os.unlink(CANONICAL_LOCK, dir_fd=mem_fd)


class InstanceLock:
    """``flock`` on the memory dir's ``.memstaged.lock``; the kernel drops it when we die."""

    def __init__(self, memory_dir: str) -> None:
        self.memory_dir = memory_dir
        self.path = os.path.join(memory_dir, INSTANCE_LOCK)
        self._fd: int | None = None

    def acquire(self, *, wait: bool) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise BusyError(
                f"another memstaged (pid {holder}) is working on {self.memory_dir}; "
                "use --wait to wait for it"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays for the next one
            self._fd = None


def instance_holder(memory_dir: str) -> int | None:
    """The pid of the memstaged working on ``memory_dir``, or ``None`` (for ``status``)."""
    try:
        fd = os.open(os.path.join(memory_dir, INSTANCE_LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else 0
        return None
    finally:
        os.close(fd)
