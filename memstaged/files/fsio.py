"""File-system primitives with the guarantees SPEC sections 5 and 6 ask for.

Everything works relative to directory file descriptors opened with ``O_NOFOLLOW``, so a
``staging/`` or ``deadletter/`` replaced by a symbolic link is refused rather than followed, and a
name is never resolved twice along a path that could change in between. What the temp files
written here are called is :mod:`memstaged.files.temp_names`'s; a read lease on a version being
decided is :mod:`memstaged.files.version`'s.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar

import msgspec

from memstaged.core import digests

if TYPE_CHECKING:
    import socket
from memstaged.errors import NotPrivate
from memstaged.files.temp_names import PARTIAL, temp_name
from memstaged.patience import poll

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


def private_dirs(path: Path) -> None:
    """``mkdir -p`` with every directory it creates 0700, parents included (SPEC 6).

    ``Path.mkdir(parents=True, mode=0o700)`` gives the mode to the last one only: the parents
    get the umask's default (0755), and ``$XDG_STATE_HOME/memstaged`` was world-readable.
    Directories that exist already are left as they are: they are not memstaged's.
    """
    missing: list[Path] = []
    here = path
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another process


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_private(fd: int, path: os.PathLike[str] | str) -> None:
    """Raise :class:`~memstaged.errors.NotPrivate` unless ``fd`` is of a directory that is the
    user's own (the effective uid's) and private (no permission for group or others).

    The user's own directory that group or others may read or enter but not write (0755, as
    versions before 0.2 left ``$XDG_STATE_HOME/memstaged``) is made private (``fchmod`` 0700):
    no one else can have put anything in it. One that others may write is refused.
    """
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not mode & 0o022:
        if mode & 0o077:
            os.fchmod(fd, mode & 0o700)
        return
    why = (
        f"bad ownership or modes for directory {os.fspath(path)} (owner {_owner(st.st_uid)}, "
        f"mode {mode:04o}): it must be {_owner(os.geteuid())}'s own, mode 0700"
    )
    raise NotPrivate(errno.EPERM, why, os.fspath(path))


def open_private_dir(
    path: os.PathLike[str] | str, dir_fd: int | None = None, *, create: bool = True
) -> int:
    """Open the directory memstaged keeps its own files in (its state dir, its control
    socket's), checked to be the user's own and private (:func:`check_private`), through the
    descriptor it returns: it cannot be swapped between the check and its use.

    ``create``: a missing one is made 0700 (its parents too, for a path not relative to
    ``dir_fd``). Its last component is never followed: a link there is refused (NotPrivate).
    Raises :class:`OSError` (``FileNotFoundError`` when missing and not ``create``).
    """
    name = os.fspath(path)
    if create and dir_fd is None:
        private_dirs(Path(name))
    try:
        fd = open_dir(name, dir_fd, create=create)
    except OSError as err:
        if is_link(err, dir_fd, name):
            raise NotPrivate(
                errno.EPERM,
                f"bad ownership or modes for directory {name}: a symbolic link, not a "
                "directory of memstaged's own",
                name,
            ) from None
        raise
    try:
        check_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def state_subdir(state_dir: os.PathLike[str] | str, sub: str, *, create: bool) -> Iterator[int]:
    """The descriptor of ``state_dir/sub`` for the block: ``state_dir`` opened by
    :func:`open_private_dir` (again at each use: a link put in its place meanwhile is refused,
    not followed), ``sub`` relative to it without following a link, and checked private too.
    A file of memstaged's state is then read and written relative to it, never by its path.
    Raises :class:`OSError` (``FileNotFoundError`` when missing and not ``create``)."""
    base = open_private_dir(state_dir, create=create)
    try:
        fd = open_private_dir(sub, base, create=create)
    finally:
        os.close(base)
    try:
        yield fd
    finally:
        os.close(fd)


#: Links followed on the way to a directory of memstaged's own, at most (the kernel's own limit).
_MAX_LINKS: Final = 40


def check_ancestors(path: os.PathLike[str] | str) -> str:
    """Raise :class:`~memstaged.errors.NotPrivate` unless no other user can change where
    ``path`` leads: each directory on the way to it, as the path is walked the kernel's way (its
    links followed, a ``..`` taken from where the walk is), is the effective user's or root's
    and writable by no one else unless it is sticky (``/tmp``), and each link on the way is the
    user's or root's, as ssh checks the path to ``authorized_keys``. Another user who may write
    a directory on the way, or who owns a link on it, could make the path lead elsewhere after
    memstaged checked it. The last component is left to :func:`check_private`; components still
    missing are memstaged's to make. Returns where the path leads (:func:`walk_to`)."""
    given = os.fspath(path)
    for kind, where, st in _walk(given):
        if kind == "dir":
            _check_on_the_way(where, given)
        elif kind == "link" and st is not None and st.st_uid not in (0, os.geteuid()):
            raise NotPrivate(
                errno.EPERM,
                f"bad ownership for link {where} on the way to {given} (owner "
                f"{_owner(st.st_uid)}): another user could make it lead elsewhere",
                where,
            )
        elif kind == "end":
            return where
    raise AssertionError("a walk always ends")  # pragma: no cover


def walk_to(path: os.PathLike[str] | str) -> str:
    """Where ``path`` leads, walked as :func:`check_ancestors` walks it (no check made): the
    directory memstaged then uses. Raises :class:`OSError` for a way that leads nowhere."""
    for kind, where, _st in _walk(os.fspath(path)):
        if kind == "end":
            return where
    raise AssertionError("a walk always ends")  # pragma: no cover


def _walk(given: str) -> Iterator[tuple[str, str, os.stat_result | None]]:
    """The way to ``given``, step by step: ("dir", a directory passed through, its stat),
    ("link", a link followed, its lstat), and last ("end", where it leads, None). A missing
    component ends the walk there, the rest made by memstaged; a ``..`` after one, or more than
    :data:`_MAX_LINKS` links, is refused (``ENOENT``, ``ELOOP``) as the kernel refuses it."""
    absolute = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    todo = [p for p in absolute.split("/") if p and p != "."]
    here, links = "/", 0
    yield "dir", here, None
    while todo:
        part = todo.pop(0)
        if part == "..":
            here = os.path.dirname(here)
            continue
        nxt = os.path.join(here, part)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if ".." in todo:
                raise FileNotFoundError(
                    errno.ENOENT, "a missing directory on the way", nxt
                ) from None
            yield "end", os.path.join(nxt, *todo), None
            return
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise NotPrivate(errno.ELOOP, f"too many links on the way to {given}", given)
            yield "link", nxt, st
            target = os.readlink(nxt)
            if target.startswith("/"):
                here = "/"
            todo[:0] = [p for p in target.split("/") if p and p != "."]
            continue
        here = nxt
        if todo:  # the last, the directory itself: check_private's
            yield "dir", here, None
    yield "end", here, None


def _check_on_the_way(here: str, given: str) -> None:
    st = os.stat(here)  # a directory, not a link: the walk resolved it
    writable_by_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (0, os.geteuid()) or writable_by_others:
        raise NotPrivate(
            errno.EPERM,
            f"bad ownership or modes for directory {here} above {given} (owner "
            f"{_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}): another user could "
            "replace what is below it",
            here,
        )


def private_dir(path: os.PathLike[str] | str, *, create: bool = True) -> bool:
    """Check the directory at ``path`` as :func:`open_private_dir` does (making it if
    ``create``); whether it exists (``False`` only without ``create``)."""
    try:
        fd = open_private_dir(path, create=create)
    except FileNotFoundError:
        if create:
            raise
        return False
    os.close(fd)
    return True


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


@contextmanager
def opened_dir(path: str, dir_fd: int | None = None, *, create: bool = False) -> Iterator[int]:
    fd = open_dir(path, dir_fd, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(fd: int) -> None:
    os.fsync(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unnamed(dir_fd: int) -> int | None:
    """An unnamed file in ``dir_fd`` (``O_TMPFILE``), or None where the file system has none."""
    try:
        return os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


_T = TypeVar("_T")


def _create_private(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` in ``dir_fd``: 0600 from its creation (then ``mode`` exactly, not
    the umask's, for a file others are to read), never through a link, never one that is
    already there."""
    fd = os.open(
        name,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    if mode != 0o600:
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
    return fd


def put_complete(
    dir_fd: int,
    name: str,
    fill: Callable[[int], _T],
    *,
    partial: str | None,
    unnamed: bool = True,
    replace: bool = False,
    sync: bool = True,
    created: str = "",
    complete: str = "",
    mode: int = 0o600,
) -> _T:
    """Put a file under ``name`` in ``dir_fd`` only once ``fill`` has written all of it.

    The one way memstaged writes a file of its own (temps, dead-letter copies, the writer lock,
    the seen cache): mode 0600 from creation (never the umask's, never a later ``chmod``), the
    bytes written by ``fill(fd)`` and fsynced (unless ``sync`` is false) before the name
    exists. With ``unnamed``, the bytes go to an ``O_TMPFILE`` inode that is linked under
    ``name`` (``FileExistsError`` if it is taken); without one (or with ``replace``, which a
    link cannot do), they go to the temp file ``partial``, renamed onto ``name`` (replacing it
    with ``replace``, else ``RENAME_NOREPLACE``). With ``partial`` None the file is created
    under ``name`` itself, and removed again if ``fill`` fails. ``created`` and ``complete``
    name the crash points after the file is opened and after its bytes are durable. ``mode``:
    the file's mode, 0600 unless others are to read it (a unit, a completion script).
    """
    fd = _unnamed(dir_fd) if unnamed and not replace and mode == 0o600 else None
    part = None
    if fd is None:
        part = name if partial is None else partial
        fd = _create_private(dir_fd, part, mode)
    try:
        if created:
            crash_point(created)
        result = fill(fd)
        if sync:
            os.fsync(fd)
        if complete:
            crash_point(complete)
        if part is None:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd)
        elif part != name:
            if replace:
                os.rename(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                rename_noreplace(dir_fd, part, dir_fd, name)
    except BaseException:
        os.close(fd)
        if part is not None:
            unlink_quietly(dir_fd, part)  # never ``name`` once renamed: that failed, or raised
        raise
    os.close(fd)
    return result


def replace_file(
    path: os.PathLike[str] | str,
    data: bytes,
    *,
    sync: bool = True,
    mode: int = 0o600,
    parents: bool = False,
) -> None:
    """Replace ``path`` (a file the user named or installs: the metrics file, a unit, a
    completion script) with ``data`` as :func:`replace_at` does, with ``mode``. The directory is
    opened without following a link in its last component; with ``parents``, missing ones are
    made first (0755: what is installed there is for others too). Raises :class:`OSError`."""
    parent, name = os.path.split(os.fspath(path))
    if parents and parent:
        os.makedirs(parent, 0o755, exist_ok=True)
    dir_fd = os.open(parent or ".", _DIR_FLAGS)
    try:
        replace_at(dir_fd, name, data, sync=sync, mode=mode)
    finally:
        os.close(dir_fd)


def replace_at(
    dir_fd: int, name: str, data: bytes, *, sync: bool = True, mode: int = 0o600
) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` through :func:`put_complete`: ``mode``
    (0600) from creation, a reader sees the old file or the new one whole. Raises
    :class:`OSError`."""
    tmp = f".{name}.{os.getpid()}.tmp"
    unlink_quietly(dir_fd, tmp)  # a crashed run's, under the same pid: O_EXCL would refuse
    put_complete(
        dir_fd,
        name,
        lambda fd: write_all(fd, data),
        partial=tmp,
        replace=True,
        sync=sync,
        mode=mode,
    )


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


def devnull_over(fd: int) -> None:
    """Point ``fd`` (a closed pipe's stdout) at /dev/null: no later write can fail again.
    Raises :class:`OSError`."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


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


def write_temp(
    dir_fd: int, data: bytes, role: str, for_name: str = "", *, sync: bool = True
) -> str:
    """Write ``data`` to a new temp file in ``dir_fd`` (0600), fsynced unless told otherwise.

    The temp file gets its name only once it is complete: the bytes go to an unnamed
    ``O_TMPFILE`` inode, linked under the name when written. A crash therefore never leaves a
    partial temp that recovery could not tell from a writer's version displaced by an exchange.
    (Without ``O_TMPFILE``, a :data:`PARTIAL` temp is renamed; recovery deletes those.)
    """
    return _write_temp(dir_fd, data, role, for_name, sync=sync, hold=False)[0]


def write_held_temp(
    dir_fd: int, data: bytes, role: str, for_name: str = "", *, sync: bool = True
) -> tuple[str, int]:
    """:func:`write_temp`, and a descriptor of the temp holding an exclusive ``flock`` on it,
    taken before it has its name; the caller closes it once the temp is renamed or removed.

    For a temp written by a process that works beside the daemon (``deadletter recover``): a
    memstaged starting meanwhile must not take it for a killed process's leftover and delete it
    (:func:`temp_in_use`). The kernel drops the lock when the process dies, so a killed
    writer's temps are still cleaned up.
    """
    return _write_temp(dir_fd, data, role, for_name, sync=sync, hold=True)


def _write_temp(
    dir_fd: int, data: bytes, role: str, for_name: str, *, sync: bool, hold: bool
) -> tuple[str, int]:
    name = temp_name(role, for_name)
    held: list[int] = []

    def fill(fd: int) -> None:
        if hold:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new inode: no one else has it
            held.append(os.dup(fd))  # the same open file, so the same lock, kept past close
        write_all(fd, data)

    try:
        put_complete(
            dir_fd,
            name,
            fill,
            partial=temp_name(PARTIAL, for_name),
            sync=sync,
            created="temp-created",
        )
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return name, held[0] if held else -1


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
    """Does a live process hold the ``flock`` of this temp (:func:`write_held_temp`)?

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


def copy_to_temp(
    src_fd: int, dir_fd: int, role: str, for_name: str = "", *, most: int | None = None
) -> tuple[str, str, int]:
    """Copy a file in bounded chunks to a fsynced temp file; returns name, sha256 and size.

    With ``most``, no more than that many bytes are copied (a growing file is not chased):
    raises ``OSError(EFBIG)`` if there is more.
    """
    name = temp_name(role, for_name)

    def copy(fd: int) -> tuple[str, int]:
        digest = digests.sha256()
        size = 0
        while chunk := os.pread(
            src_fd, CHUNK if most is None else min(CHUNK, most - size + 1), size
        ):
            if most is not None and size + len(chunk) > most:
                raise OSError(errno.EFBIG, "larger than it was when it was decided", for_name)
            digest.update(chunk)
            size += len(chunk)
            write_all(fd, chunk)
        return digest.hexdigest(), size

    sha256, size = put_complete(dir_fd, name, copy, partial=None, unnamed=False)
    return name, sha256, size


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
