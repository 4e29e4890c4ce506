"""File-system primitives with the guarantees SPEC sections 5 and 6 ask for.

Everything works relative to directory file descriptors opened with ``O_NOFOLLOW``, so a
``staging/`` or ``deadletter/`` replaced by a symbolic link is refused rather than followed, and a
name is never resolved twice along a path that could change in between. Here: directories opened
so (:func:`open_dir`, :func:`open_below`), the renames that never lose a file (``renameat2``:
:func:`exchange`, :func:`rename_noreplace`) and ``syncfs``, the crash points of the tests, what
tells two versions of a file apart (:class:`Identity`), removals, the one bounded wait for a
``flock`` and the control socket's bind.

The rest of the file layer's primitives have modules of their own: the safe open and read of a
file (:mod:`memstaged.files.safe_open`), the one way a file is written
(:mod:`memstaged.files.atomic_write`), memstaged's private directories
(:mod:`memstaged.files.private_dirs`); a read lease on a version being decided is
:mod:`memstaged.files.version`'s.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import signal
import stat
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, NamedTuple, TextIO

import msgspec

from memstaged.patience import poll

if TYPE_CHECKING:
    import socket

#: The most bytes read or written at a time: a file of any size is copied or hashed in bounded
#: memory.
CHUNK: Final = 1 << 20
_RENAME_NOREPLACE: Final = 1
_RENAME_EXCHANGE: Final = 2
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Libc:
    """``renameat2`` and ``syncfs`` from libc through ctypes, loaded on first use: a command
    that changes nothing (``status``, ``--once`` with nothing new) does not import ctypes."""

    def __init__(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self.renameat2 = libc.renameat2
        self.renameat2.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_uint,
        ]
        self.renameat2.restype = ctypes.c_int
        self.syncfs = libc.syncfs
        self.syncfs.argtypes = [ctypes.c_int]
        self.syncfs.restype = ctypes.c_int
        self.get_errno = ctypes.get_errno


_LIBC: list[_Libc] = []


def _libc() -> _Libc:
    if not _LIBC:
        _LIBC.append(_Libc())
    return _LIBC[0]


def load_libc() -> None:
    """Load ``renameat2``/``syncfs`` now, before a transaction that will need them: importing
    ctypes (a few ms) inside one would sit between a decision's announcement and its change."""
    _libc()


def syncfs(fd: int) -> None:
    """Make everything written to the file system holding ``fd`` durable, in one call.

    A batch writes many temp files without fsyncing each, then makes them durable together
    before any of them is given its name or takes a staging file's place (SPEC 5's order).
    """
    libc = _libc()
    if libc.syncfs(fd) != 0:
        err = libc.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


def _crash_plan(spec: str) -> tuple[str, int, signal.Signals] | None:
    step, _, count = spec.rpartition(":")
    sig = signal.SIGKILL
    if not count.isdigit():  # <step>:<n>:<signal>
        name = count.upper()
        step, _, count = step.rpartition(":")
        try:
            sig = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except KeyError:
            return None
    return (step, int(count), sig) if step and count.isdigit() and int(count) > 0 else None


#: Test hook, read once at import: ``MEMSTAGED_CRASH_AT=<step>:<n>`` kills this process with
#: SIGKILL the n-th time :func:`crash_point` reaches ``<step>`` (``any`` matches every step);
#: ``<step>:<n>:<signal>`` (``INT``, ``TERM``) sends that signal instead, so that a test can
#: interrupt a run at a known step rather than guess when it is there.
_CRASH_AT: Final = _crash_plan(os.environ.get("MEMSTAGED_CRASH_AT", ""))
_crash_counts: Counter[str] = Counter()


def crash_point(step: str) -> None:
    """A named point between two steps of a write; a no-op unless ``MEMSTAGED_CRASH_AT`` is set.

    The crash-consistency tests use it to kill memstaged inside the narrow windows of a rewrite
    or a quarantine (after the temp file is written, after the exchange, after the rename-away,
    ...) instead of hoping a random SIGKILL lands there.
    """
    if _CRASH_AT is None:
        return
    wanted, nth, sig = _CRASH_AT
    if wanted not in (step, "any"):
        return
    _crash_counts[wanted] += 1
    if _crash_counts[wanted] == nth:
        os.kill(os.getpid(), sig)


class Identity(msgspec.Struct, frozen=True, array_like=True):
    """What tells two versions of a file apart without reading them (SPEC 5).

    A writer can set the mtime back and keep the size (``cp -p``, ``rsync -t``), but not the
    ctime; and the inode number cannot be reused while memstaged keeps the version it read open.
    """

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _rename2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    libc = _libc()
    if libc.renameat2(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), flags) != 0:
        err = libc.get_errno()
        raise OSError(err, f"renameat2 {src} -> {dst}: {os.strerror(err)}")


def exchange(dir_fd: int, a: str, b: str) -> None:
    """Swap two names atomically: the displaced version is handed back, never overwritten."""
    _rename2(dir_fd, a, dir_fd, b, _RENAME_EXCHANGE)


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Rename, failing with ``EEXIST`` instead of replacing what is at ``dst``."""
    _rename2(src_dir, src, dst_dir, dst, _RENAME_NOREPLACE)


def open_dir(path: str, dir_fd: int | None = None, *, create: bool = False) -> int:
    """Open a directory without following a link; create its last component 0700 if asked.

    Relative to ``dir_fd``, every component of ``path`` is opened on its own with
    ``O_NOFOLLOW`` (``O_NOFOLLOW`` alone guards only the last one: ``deadletter/originals``
    with a linked ``deadletter/`` would be followed). An absolute ``path``
    follows links in everything but its last component: that is the configured literal prefix.
    """
    if dir_fd is not None and "/" in path.strip("/"):
        parts = [p for p in path.split("/") if p and p != "."]
        fd = os.dup(dir_fd)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                nxt = open_dir(part, fd, create=create and last)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd
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


def open_below(anchor: str, path: str) -> int:
    """Open ``path`` (absolute, below ``anchor``), following links only within ``anchor``.

    SPEC 6: the literal prefix of a configured path may contain links; below it (the components
    a glob matched, or ``.pi/memory/project`` when the memory dir was derived) none is followed.
    """
    rel = os.path.relpath(path, anchor) if anchor else ""
    if not anchor or rel == "." or rel.startswith(".."):
        return open_dir(path)
    base = os.open(anchor, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        return open_dir(rel, base)
    finally:
        os.close(base)


class FdLimit(NamedTuple):
    """``RLIMIT_NOFILE`` at start: the soft limit found, the one in force, the hard limit."""

    found: int
    soft: int
    hard: int


def raise_fd_limit() -> FdLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (SPEC 6: a service manager's soft
    limit is 1,024, its hard limit far higher; each memory dir holds one descriptor)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft == infinite or (hard != infinite and soft >= hard):
        return FdLimit(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError):
        return FdLimit(soft, soft, hard)
    return FdLimit(soft, hard, hard)


#: Without ``/proc``, the descriptors below this number are looked at one by one to count
#: those open (a few milliseconds); any above it are not counted.
_PROBED_FDS: Final = 1 << 16


def descriptors_open() -> int:
    """How many descriptors this process has open now: its ``/proc/self/fd``, the listing's own
    left out; without ``/proc``, those below the soft limit (and :data:`_PROBED_FDS`) that
    ``fcntl`` finds open."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        pass
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    most = _PROBED_FDS if soft == resource.RLIM_INFINITY else min(soft, _PROBED_FDS)
    count = 0
    for fd in range(most):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            continue
        count += 1
    return count


@functools.cache
def proc_fd_linkable() -> bool:
    """Whether ``/proc/self/fd`` is there (``/proc`` mounted), through which an unnamed
    ``O_TMPFILE`` inode gets its name; looked at once."""
    return os.path.isdir("/proc/self/fd")


@contextmanager
def opened_dir(path: str, dir_fd: int | None = None, *, create: bool = False) -> Iterator[int]:
    fd = open_dir(path, dir_fd, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(fd: int) -> None:
    os.fsync(fd)


def remove(path: os.PathLike[str] | str, *, tree: bool = False) -> None:
    """Remove the file (or link) at ``path`` if there is one; with ``tree``, a directory and
    everything in it (never following a link). Raises :class:`OSError` but for a missing one."""
    import shutil  # only uninstall removes trees

    if tree and os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_regular(path: os.PathLike[str] | str) -> bool:
    """Remove the regular file at ``path``, never anything else (a link, whatever it points
    to, a directory, a socket): whether it removed one. The name is looked at and removed
    relative to its directory (the path up to it is the user's, links followed). Raises
    :class:`OSError` but for a missing one."""
    parent, name = os.path.split(os.fspath(path))
    try:
        dir_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        st = lstat_at(dir_fd, name)
        if st is None or not stat.S_ISREG(st.st_mode):
            return False
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    finally:
        os.close(dir_fd)
    return True


def remove_empty_dir(path: os.PathLike[str] | str) -> bool:
    """Remove the directory at ``path`` if it is empty; whether it was."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def rename(src: os.PathLike[str] | str, dst: os.PathLike[str] | str) -> None:
    """Rename ``src`` onto ``dst`` (a rotated log file). Raises :class:`OSError`."""
    os.rename(src, dst)


def hold_standard_fds() -> None:
    """Open ``/dev/null`` on each of descriptors 0, 1 and 2 that is closed (``<&-``, ``>&-``,
    ``2>&-``), so that nothing opened later takes one of their numbers: a decision log or an
    instance lock on descriptor 1 would be kept open by the decider processes (which keep 0-2,
    as every process does) and written to by a stray ``print``."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null == fd:
                os.set_inheritable(fd, True)  # 0-2 are, as usual
            else:
                os.dup2(null, fd)
                os.close(null)


def stream_on(fd: int) -> TextIO:
    """A text stream on descriptor ``fd``, left open when the stream is closed (what
    ``sys.stderr`` becomes where it was closed as the process started)."""
    return open(fd, "w", errors="backslashreplace", closefd=False)


def devnull_over(fd: int) -> None:
    """Point ``fd`` (a closed pipe's stdout) at /dev/null: no later write can fail again.
    Raises :class:`OSError`."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def bind_private(sock: socket.socket, name: str) -> tuple[int, int]:
    """Bind ``sock`` (``AF_UNIX``) at ``name``, in a directory already checked private, replacing
    a socket left there (by an earlier process given the same pid: long dead), and make it
    0600; its identity, for :func:`unbind`. Raises :class:`OSError`."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)
    sock.bind(name)
    os.chmod(name, 0o600)  # the directory is 0700 already: no window
    st = os.lstat(name)
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, "not a socket", name)
    return st.st_dev, st.st_ino


def unbind(name: str, ident: tuple[int, int]) -> None:
    """Remove the socket at ``name`` if it is still the one bound (``ident``). Raises
    :class:`OSError`."""
    st = os.lstat(name)
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == ident:
        os.unlink(name)


def sync_dir(path: os.PathLike[str] | str) -> None:
    """fsync the directory at ``path``: the names created and renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_dir_following(path: os.PathLike[str] | str) -> int:
    """A descriptor of the directory at ``path``, links followed (a path the user named)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def flock_within(fd: int, patience: float) -> bool:
    """``flock(LOCK_EX)`` on ``fd``, waiting at most ``patience`` seconds; whether it was had.

    The one wait for a ``flock`` another process holds (the decision log's, the ack marks'):
    polled (1 ms, doubling to 50 ms), since ``flock`` has no timeout and an alarm would
    interrupt whatever else the process does. Only a contended lock polls. The caller says what
    it waited for when it was not had.
    """

    def attempt() -> bool | None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # held by another process: wait for it, a while
        return True

    return poll(attempt, patience, first=0.001, most=0.05) or False


def temp_in_use(dir_fd: int, name: str) -> bool:
    """Does a live process hold the ``flock`` of this temp
    (:func:`~memstaged.files.atomic_write.write_held_temp`)?

    Then it is no leftover of a crash, and crash recovery leaves it alone. The lock is tried
    and dropped at once (``LOCK_NB``); a temp that cannot be opened is not known to be in use.
    """
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


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


def is_link(err: OSError, dir_fd: int | None, name: str) -> bool:
    """Did opening a directory fail because it is a symbolic link (``O_NOFOLLOW``)?

    With ``O_DIRECTORY`` Linux reports a link as ``ENOTDIR``, not ``ELOOP``: look.
    """
    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
        return False
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
