"""The two locks of SPEC section 5.

* ``canonical-writer.lock``: the reconciler's lock. While a live process holds it, memstaged changes
  nothing in that memory dir. memstaged takes it, create-exclusive, only for the instant it rewrites
  or removes a file. It never deletes a lock it did not create; a lock memstaged created whose
  process is gone would block the reconciler for ever, so it is removed (and that is logged).
* the instance lock: ``flock`` on a file of memstaged's own in the user's private state dir,
  named by the memory dir's identity, so a daemon and a ``--once`` run never work on one memory
  dir at once, a killed one never blocks the next, nothing is left in the memory dir, and no
  other user can take it first. Recovery and purge do not take it: they work beside the daemon,
  under ``canonical-writer.lock``, which the daemon obeys.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec

from memstaged import safe_text
from memstaged.core.timestamps import format_epoch_ms
from memstaged.errors import BusyError, ConfigError, LockHeld, NotPrivate
from memstaged.files import private_dirs, safe_open
from memstaged.files.atomic_write import put_complete, write_all
from memstaged.files.fsio import crash_point
from memstaged.files.memdir import MemoryDir
from memstaged.files.temp_names import temp_name

if TYPE_CHECKING:
    from memstaged.files.plan import StaleLock

CANONICAL_LOCK: Final = "canonical-writer.lock"
#: How long ``--wait`` waits for another memstaged by default (SPEC 5: a wait has a limit).
DEFAULT_WAIT: Final = 30.0
#: How often a wait looks again.
WAIT_POLL: Final = 0.1
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OWNER: Final = "memstaged"
#: An unreadable lock younger than this is taken to be still being written by its holder.
FRESH_SECONDS: Final = 10.0
#: A process that started this much later than the lock it seems to hold is not its holder.
_PID_REUSE_SLACK: Final = 2.0


class LockInfo(msgspec.Struct, frozen=True):
    """What a ``canonical-writer.lock`` says and whether its holder is alive."""

    pid: int | None
    owner: str | None
    alive: bool
    ino: int

    @property
    def ours(self) -> bool:
        return self.owner == OWNER


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _process_start(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds), from ``/proc``; ``None`` if it cannot be told."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _holder_alive(pid: int, owner: object, started_at: object) -> bool:
    """Is the process that took the lock alive? A memstaged lock's pid may have been reused
    (after a reboot, say): a process that started after the lock was taken is not its holder."""
    if not pid_alive(pid):
        return False
    if owner != OWNER or not isinstance(started_at, str):
        return True
    try:
        taken = dt.datetime.fromisoformat(started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    started = _process_start(pid)
    return started is None or started <= taken + _PID_REUSE_SLACK


def read_lock(mem_fd: int) -> LockInfo | None:
    """The canonical-writer lock of a memory dir, or ``None`` when there is none.

    A lock that is a symbolic link, a FIFO or anything but a regular file is obeyed and never
    followed or read (a FIFO would block the reader).
    """
    try:
        fd = os.open(
            CANONICAL_LOCK,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            dir_fd=mem_fd,
        )
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        try:
            st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return LockInfo(None, None, True, st.st_ino)  # a link or a socket: obey it, never follow
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return LockInfo(None, None, True, st.st_ino)
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
    alive = _holder_alive(pid, owner, content.get("started_at"))
    return LockInfo(pid, owner if isinstance(owner, str) else None, alive, st.st_ino)


def live_lock_at(memory_dir: str) -> bool:
    """Whether a live process holds the ``canonical-writer.lock`` of the memory dir at this path.

    The daemon looks again every so often at a lock its files wait for: a holder that dies
    leaves it behind, and no event says so. Unreadable, or no memory dir there: not held.
    """
    try:
        fd = os.open(memory_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        info = read_lock(fd)
    except OSError:
        info = None
    finally:
        os.close(fd)
    return info is not None and info.alive


def memstaged_role(pid: int) -> str | None:
    """What the memstaged process ``pid`` is, from its command line: ``once``, ``deadletter``
    or ``daemon``; None when it is not memstaged, or its command line cannot be read (gone, or
    not ours to read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return None
    if not runs_memstaged(argv):
        return None
    if b"--once" in argv:
        return "once"
    if b"deadletter" in argv:
        return "deadletter"
    return "daemon"


def service_unit(pid: int) -> str | None:
    """The systemd service the process ``pid`` runs as (``memstaged.service``): the last
    component of its cgroup, from ``/proc/PID/cgroup`` (the unified hierarchy's line, else
    systemd's own on a legacy host). ``None`` when that is no service (a terminal's session
    or scope, a user manager itself) or cannot be read."""
    try:
        text = safe_open.read_small(f"/proc/{pid}/cgroup").decode("utf-8", "replace")
    except OSError:
        return None
    unified = legacy = ""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            unified = path
        elif "name=systemd" in controllers.split(","):
            legacy = path
    last = (unified if unified.strip("/") else legacy).rstrip("/").rpartition("/")[2]
    manager = last.startswith("user@")  # user@UID.service holds only the manager's init.scope
    return last if last.endswith(".service") and not manager else None


#: Interpreter options that take the next word as their value (``python -X dev memstaged``).
_VALUED_OPTIONS: Final = (b"-W", b"-X", b"--check-hash-based-pycs")


def runs_memstaged(argv: list[bytes]) -> bool:
    """Whether a command line runs memstaged: the ``memstaged`` script, by itself or by its
    interpreter (``python3 /usr/bin/memstaged``), or ``python -m memstaged``."""
    if not argv or not argv[0]:
        return False
    program = os.path.basename(argv[0])
    if program == b"memstaged":
        return True
    if not program.startswith(b"python"):
        return False
    words = iter(argv[1:])
    for word in words:
        if word == b"-m":
            return next(words, None) == b"memstaged"
        if word.startswith((b"-m", b"-c")) or word == b"-":
            return word == b"-mmemstaged"
        if word in _VALUED_OPTIONS:
            next(words, None)
        elif not word.startswith(b"-"):
            return os.path.basename(word) == b"memstaged"
    return False


def log_stale_lock(logger: Any, info: LockInfo, removed: bool, **fields: Any) -> None:
    """``lock_seen`` for a ``canonical-writer.lock`` whose process is gone: removed when it was
    memstaged's own, else not obeyed (SPEC 7)."""
    logger.warning(
        "lock_seen",
        lock=CANONICAL_LOCK,
        pid=info.pid,
        owner=info.owner,
        alive=False,
        action="removed (memstaged's own, its process is gone)" if removed else "not obeyed",
        **fields,
    )


def remove_stale_own_lock(mem_fd: int, info: LockInfo) -> bool:
    """Remove a lock memstaged created whose process is gone, if it is still that same file."""
    if not info.ours or info.alive:
        return False
    st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)  # FileNotFoundError: gone
    if st.st_ino != info.ino:
        return False
    os.unlink(CANONICAL_LOCK, dir_fd=mem_fd)
    return True


def lock_to_obey(mem_fd: int, logger: Any) -> LockInfo | None:
    """The ``canonical-writer.lock`` memstaged must obey in a memory dir (SPEC 5), or ``None``.

    A lock whose process is gone is not obeyed: memstaged's own is removed (else it would block
    the reconciler for ever), and either is logged (``lock_seen``).
    """
    info = read_lock(mem_fd)
    if info is None:
        return None
    if info.alive:
        return info
    try:
        removed = remove_stale_own_lock(mem_fd, info)
    except FileNotFoundError:
        return None  # released meanwhile
    log_stale_lock(logger, info, removed)
    return None


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
        ino = _create_lock(mem_fd, body)
        if ino is None:
            info = read_lock(mem_fd)
            if info is None:
                continue  # released meanwhile
            if info.alive:
                raise LockHeld(info)
            try:
                removed = remove_stale_own_lock(mem_fd, info)
            except FileNotFoundError:
                continue  # removed meanwhile
            if on_stale is not None:
                on_stale(info, removed)
            if removed:
                continue
            yield info
            return
        crash_point("lock-taken")
        try:
            yield None
        finally:
            _release(mem_fd, ino)
        return
    raise LockHeld(LockInfo(None, None, True, 0))


def _create_lock(mem_fd: int, body: bytes) -> int | None:
    """Put a complete lock file in place, create-exclusive; its inode, or None if one is there.

    The lock is written and fsynced before it gets its name, so that no one (not the
    reconciler, not the next memstaged after a SIGKILL or a power cut) ever sees an empty
    ``canonical-writer.lock`` whose owner it cannot tell: such a lock could never be removed and
    would block the reconciler for ever. An unnamed ``O_TMPFILE`` inode is linked into place
    (``linkat`` fails if the name exists), so a lost race changes nothing in the memory dir and
    a crash leaves nothing behind; where ``O_TMPFILE`` is missing, a named temp file is renamed
    into place with ``RENAME_NOREPLACE`` instead (a crash's leftover is removed on the next start).
    """

    def fill(fd: int) -> int:
        write_all(fd, body)
        return os.fstat(fd).st_ino

    try:
        return put_complete(
            mem_fd,
            CANONICAL_LOCK,
            fill,
            partial=temp_name("lock", CANONICAL_LOCK),
            complete="lock-created",
        )
    except FileExistsError:
        return None


def _release(mem_fd: int, ino: int) -> None:
    """Remove the lock memstaged took, unless it is gone or is no longer that same file."""
    try:
        st = os.stat(CANONICAL_LOCK, dir_fd=mem_fd, follow_symlinks=False)
        if st.st_ino == ino:
            os.unlink(CANONICAL_LOCK, dir_fd=mem_fd)
    except FileNotFoundError:
        pass


#: The directory of the instance locks, in the state dir.
INSTANCES: Final = "instances"
_LOCK_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def instance_lock_path(state_dir: Path, dir_id: tuple[int, int]) -> Path:
    """The instance lock of the memory dir whose ``(st_dev, st_ino)`` is ``dir_id``: two paths
    to one directory (a bind mount, a linked prefix) have one lock."""
    return state_dir / INSTANCES / f"{dir_id[0]}-{dir_id[1]}.lock"


def _open_lock_file(state_dir: Path, path: Path) -> int:
    """The lock file ``path``, opened (made 0600 if missing) in ``<state dir>/instances``,
    which is made 0700 if missing; the state dir and it are both checked to be the user's own
    and private, on the descriptors the file is opened through
    (:func:`~memstaged.files.private_dirs.open_private_dir`).
    Raises :class:`ConfigError`: without it, no memory dir can be worked on."""
    try:
        state_fd = private_dirs.open_private_dir(state_dir)
        try:
            dir_fd = private_dirs.open_private_dir(INSTANCES, state_fd)
        finally:
            os.close(state_fd)
        try:
            fd = os.open(path.name, _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except NotPrivate as err:
        raise ConfigError(f"state dir: {err.strerror}") from None
    except OSError as err:
        raise ConfigError(f"instance lock {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # O_NONBLOCK: a FIFO there did not block
        os.close(fd)
        raise ConfigError(f"instance lock {path}: not a regular file")
    return fd


class InstanceLock:
    """``flock`` on an empty file of memstaged's own, ``<state dir>/instances/<dev>-<ino>.lock``,
    named by the memory dir's identity; nothing is created in the memory dir (SPEC 5).

    Only the memory dir's user can open it: its directory is checked to be theirs and private,
    so another user who may read the memory dir cannot take the lock first and stop memstaged,
    as one ``flock`` on the memory dir itself did. The lock is on the file's inode and the
    kernel drops it when its process dies: a killed memstaged never blocks the next one. The
    file stays for the next one (its name is the memory dir's, and nothing is written in it).
    The held descriptor is the one descriptor per memory dir that SPEC 6 allows.

    memstaged processes that share a state dir (one user's) exclude each other this way; two
    users' do not (neither may open the other's lock), and their changes to one memory dir are
    kept apart by ``canonical-writer.lock``, as the reconciler's are.
    """

    def __init__(
        self,
        memory_dir: str,
        open_dir: Callable[[], int] | None = None,
        *,
        state_dir: Path | None,
    ) -> None:
        self.memory_dir = memory_dir
        self._open = open_dir or (lambda: os.open(memory_dir, _DIR_FLAGS))
        self.state_dir = state_dir
        self._fd: int | None = None

    def acquire(
        self, *, wait: bool | float = False, on_wait: Callable[[str], None] | None = None
    ) -> None:
        """Take the lock; with ``wait`` (seconds, or True for :data:`DEFAULT_WAIT`), poll for it.

        A wait has a limit (SPEC 5) and says once, through ``on_wait``, what it waits for. A
        memstaged daemon holds the lock for as long as it runs, deciding the memory dir's files
        itself: it is not waited for, and the error says so at once.
        Raises :class:`BusyError` when another memstaged holds it (after the wait),
        :class:`OSError` when the memory dir cannot be opened, and :class:`ConfigError` when
        the lock cannot be kept (no state dir, or one that is not the user's own and private).
        """
        limit = DEFAULT_WAIT if wait is True else float(wait or 0)
        if self.state_dir is None:
            raise ConfigError("no state dir: memstaged has nowhere to keep its instance locks")
        path = instance_lock_path(self.state_dir, self._identity())
        fd = _open_lock_file(self.state_dir, path)
        deadline = time.monotonic() + limit
        said = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    busy = self._busy(fd, path, limit)
                    if time.monotonic() >= deadline or busy.daemon is not None:
                        raise busy from None
                    if not said and on_wait is not None:
                        on_wait(f"waiting up to {limit:g} s: {busy}")
                        said = True
                    time.sleep(WAIT_POLL)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the memory dir (opened, no link below its anchor)."""
        fd = self._open()
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return st.st_dev, st.st_ino

    def _busy(self, fd: int, path: Path, limit: float) -> BusyError:
        """Who holds the lock, named only when it is memstaged."""
        holder = lock_holder(os.fstat(fd))
        if holder is not None and holder.role == "daemon":
            unit = service_unit(holder.pid)
            name = f"pid {holder.pid}" if unit is None else f"pid {holder.pid}, {unit}"
            return BusyError(
                f"the memstaged daemon ({name}) already decides the files of "
                f"{self.memory_dir}, for as long as it runs: waiting for it would not help",
                daemon=holder.pid,
            )
        hint = f"waited {limit:g} s" if limit else "use --wait to wait for it"
        if holder is not None and holder.role is not None:
            return BusyError(
                f"another memstaged (pid {holder.pid}) is working on {self.memory_dir}; {hint}"
            )
        who = "a process it cannot name" if holder is None else "a process that is not memstaged"
        return BusyError(f"{self.memory_dir} is busy: {who} holds its instance lock {path}; {hint}")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing our only descriptor of it drops the flock
            self._fd = None


def flock_holders() -> dict[str, int]:
    """Every exclusive ``flock`` the kernel lists in ``/proc/locks``, as ``"MAJ:MIN:INODE"`` (of
    the locked file, in hex as the kernel writes it) -> the pid holding it; empty when the
    kernel does not say.

    Reading ``/proc/locks`` takes no lock, so ``status`` never makes a starting daemon see the
    memory dir as busy. Read once for many files (:func:`flock_holder`'s ``holders``).
    """
    try:
        with open("/proc/locks", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return {}
    found: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked waiters start with "->".
        if len(fields) >= 6 and fields[1:4:2] == ["FLOCK", "WRITE"] and fields[4].isdigit():
            found.setdefault(fields[5], int(fields[4]))
    return found


def flock_holder(st: os.stat_result, holders: dict[str, int] | None = None) -> int | None:
    """The pid holding an exclusive ``flock`` on the file ``st`` is of (:func:`flock_holders`,
    read now unless given). ``None`` when no process holds one (or the kernel does not say)."""
    table = flock_holders() if holders is None else holders
    return table.get(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")


class Holder(NamedTuple):
    """The process holding a lock: its pid, and what memstaged it is (``None``: not one)."""

    pid: int
    role: str | None


def lock_holder(st: os.stat_result, holders: dict[str, int] | None = None) -> Holder | None:
    """Who holds an exclusive ``flock`` on the file ``st`` is of (:func:`flock_holder`), and
    whether it is memstaged (:func:`memstaged_role`); ``None`` when no one (or the kernel does
    not say). A holder gone between the two looks is no holder, not one that is not memstaged."""
    pid = flock_holder(st, holders)
    if not pid:
        return None
    role = memstaged_role(pid)
    if role is None and flock_holder(st) != pid:
        return None
    return Holder(pid, role)


def instance_holder(
    state_dir: Path | None, mdir: MemoryDir, holders: dict[str, int] | None = None
) -> Holder | None:
    """Who holds the instance lock of ``mdir`` (for ``status``, which takes no lock and
    creates nothing: a lock file not there yet is held by no one); ``holders``: the locks
    :func:`flock_holders` read, for many memory dirs at once."""
    dir_id = mdir.identity()
    if state_dir is None or dir_id is None:
        return None
    try:
        st = os.stat(instance_lock_path(state_dir, dir_id), follow_symlinks=False)
    except OSError:
        return None
    return lock_holder(st, holders)


def instance_lock_blocked(state_dir: Path | None, mdir: MemoryDir) -> str | None:
    """Why no memstaged can take the instance lock of ``mdir`` (for ``status``): something at
    its path that is not a regular file, which every daemon and ``--once`` refuse to open (a
    link, a FIFO, a directory), a state dir or ``instances/`` that is not the user's own and
    private (a link, another user's), or a path that cannot be looked at. None when the lock
    is a regular file or not there yet (it is made at the first run)."""
    dir_id = mdir.identity()
    if state_dir is None or dir_id is None:
        return None
    path = instance_lock_path(state_dir, dir_id)
    try:
        with private_dirs.state_subdir(state_dir, INSTANCES, create=False) as dir_fd:
            st = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None  # no state dir, no instances/ or no lock yet: each is made at the first run
    except NotPrivate as err:
        return f"state dir: {err.strerror}"
    except OSError as err:
        return f"its instance lock {path} cannot be looked at: {err.strerror}"
    if stat.S_ISREG(st.st_mode):
        return None
    return f"its instance lock {path} is {safe_text.file_kind(st.st_mode)}, not a regular file"


def log_stale_locks(logger: Any, seen: Sequence[StaleLock], **fields: Any) -> None:
    """``lock_seen`` for each stale lock a transaction saw, however it ended (SPEC 7)."""
    for lock in seen:
        log_stale_lock(logger, lock.info, lock.removed, **fields)
