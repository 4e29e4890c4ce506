"""The decision log file (SPEC 7): JSON lines that memstaged rotates itself, several writers.

The inspection commands read it without journald, and it is the one sink a change waits for: a
change whose announcement it could not take whole and durably is not carried out
(:func:`memstaged.log.writer.durable`, SPEC 5 and 7). The daemon, ``--once``, recover and purge
append to and rotate the same file, each line under an exclusive ``flock``. Also
the one-line errors of a log file that cannot be opened.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Final

from memstaged import safe_text
from memstaged.errors import ConfigError, LogUnwritable, MemstagedError
from memstaged.files import fsio, safe_open
from memstaged.files.private_dirs import private_dirs

#: After a rotation failed (a rename refused), how long (seconds) the file grows before a retry.
_ROTATE_RETRY: Final = 1.0
#: How many rotations by other processes one event follows before its write is given up: each
#: means that another process rotated the file between this one's open and its lock.
_FOLLOWS: Final = 100
#: How long an append waits for another process's lock on the log. A line holds it for
#: microseconds, a rotation for a few renames; a holder stopped inside (Ctrl-Z on a ``--once``
#: while it logs) would otherwise hold every other memstaged for as long, the daemon with
#: ``canonical-writer.lock`` in hand. Past this the event counts as not written: the change it
#: announces waits, ``deferred``, and is retried with the back-off.
LOCK_PATIENCE: Final = 5.0

#: Events this process failed to write into a decision log file, by every sink it had: a reload
#: replaces the sink, and a monitor's counter must not go back to 0 with it.
_failed_writes = 0


def failed_writes() -> int:
    """Events not written (whole, durably) into the decision log file since the process
    started (``memstaged_log_write_failures_total``)."""
    return _failed_writes


def _count_failure(events: int = 1) -> None:
    global _failed_writes  # noqa: PLW0603 - one process-wide count, see above
    _failed_writes += events


def _say(text: str) -> None:
    """One line on stderr about the log itself."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # stderr itself is closed or broken: there is nobody left to tell


class Trouble:
    """Says once that a sink fails and once that it works again, never a line per event.

    A full disk under a daemon deciding a file a second would otherwise print a line (or, with
    ``logging``, a traceback) for each decision, burying the one line that matters.
    """

    __slots__ = ("failing", "quiet", "what")

    def __init__(self, what: str, *, quiet: bool = False) -> None:
        self.what = what
        self.failing = False
        #: Say nothing: the caller reports the failure itself (recover and purge stop with it).
        self.quiet = quiet

    def failed(self, err: OSError | ValueError, consequence: str) -> None:
        if not self.failing:
            self.failing = True
            if self.quiet:
                return
            if isinstance(err, OSError) and err.strerror:
                reason = f"{err.strerror} ({errno.errorcode.get(err.errno or 0, err.errno)})"
            else:
                reason = str(err) or type(err).__name__
            _say(
                f"memstaged: {self.what}: {reason}; {consequence} (said once, until it works again)"
            )

    def recovered(self) -> None:
        self.failing = False
        if not self.quiet:
            _say(f"memstaged: {self.what}: works again")


class FileSink:
    """The JSON-lines decision log file: one whole line per event, rotated by size.

    The path must name a regular file, or nothing yet (it is created 0600). A link to a regular
    file is followed, as for the config file (the user named this path); a FIFO, socket,
    device or directory is refused (``OSError``, ``EINVAL``), ``/dev/null`` included: a decision
    log that keeps nothing would let changes be carried out unlogged. It is
    opened ``O_NONBLOCK``, so that whatever stands at the path never blocks a command.

    Rotation is ``RotatingFileHandler``'s: before a line is written, if the file's size plus the
    line would reach ``max_bytes``, ``<file>.N-1`` becomes ``<file>.N`` … and ``<file>`` becomes
    ``<file>.1`` (up to ``backups``), and the line starts a new ``<file>``, so a line is never
    split across files. Lines written together (:meth:`write_lines`: a transaction's, 1 MiB at
    most) count as one line here: they go into one file, together. A file rotated away (by this
    process or another) after lines went into it is fsynced before it is let go. With
    ``max_bytes`` or ``backups`` 0 the file just grows. Three deliberate differences: the size
    is counted in bytes (the standard library added the line's *characters* to the file's
    bytes), an empty file is not rotated away for a line longer than ``max_bytes`` (Python 3.13
    stopped doing that too), and the new file is created 0600.

    Several processes write and rotate the same file (the daemon, ``--once``, recover, purge). Every
    append holds an exclusive ``flock`` on the file it writes and checks, under it, that the path
    still names that file (``stat``); a rotation holds the same lock on the file it renames. So a
    line is only ever written into the file the path names at that moment, never into one rotated
    away (and perhaps deleted) meanwhile; the size that decides a rotation is the file's own,
    whoever appended; and the order of the lines across the files is the order in which they were
    written. A write costs ``flock``, ``stat``, ``write`` and ``flock`` (a ``pread`` of the last
    byte, too, when another process wrote since), whether it carries one event or a
    transaction's.

    A line is written whole or not at all: a write cut short (a full disk) is truncated away
    under the lock, and a line left torn by a crash is ended before the next is appended. A
    failed write is said once on stderr and counted (:attr:`failures`): :func:`durable` raises
    :class:`~memstaged.errors.LogUnwritable` for it, so that the change the event announces is
    not carried out (SPEC 5 and 7).
    """

    def __init__(self, path: Path, max_bytes: int, backups: int, *, quiet: bool = False) -> None:
        """Opens the file now: an ``OSError`` here is a configuration error for the caller.

        ``quiet``: a failed write is not said on stderr (the caller says
        :class:`~memstaged.errors.LogUnwritable` itself: recover and purge stop with it).
        """
        self.path = path
        self._name = os.fspath(path)
        self._max_bytes = max_bytes
        self._backups = backups
        self._rotates = max_bytes > 0 and backups > 0
        self._rotate_after = 0.0
        #: Where this process's last line ended, if nothing was written after it since.
        self._end = -1
        #: Events not written (whole) so far, and the last reason: see :func:`durable`.
        self.failures = 0
        self._lock_stuck = False  # the last append found the lock held too long
        self._error: OSError | None = None
        #: A file was created or renamed since the last sync: its directory is fsynced too.
        self._dir_changed = False
        #: Lines were written into the open file since its last fsync.
        self._unsynced = False
        self._writing = Trouble(f"decision log file {path}", quiet=quiet)
        self._rotating = Trouble(f"rotating the decision log file {path}")
        private_dirs(path.parent)
        self._fd, self._id = self._open()

    def _open(self) -> tuple[int, tuple[int, int]]:
        """Open (or create) the file the path names now; refuse anything but a regular file."""
        fd, st = safe_open.open_append(self._name, not_a_log_file)  # read-write: see _append
        if st.st_size == 0:
            self._dir_changed = True  # created now, perhaps: its name is made durable too
        return fd, (st.st_dev, st.st_ino)

    def _reopen(self) -> None:
        """Follow the path to the file it names now; the old one stays open until that works,
        and is fsynced before it is let go if lines went into it since its last fsync: they
        may announce changes (:meth:`sync` fsyncs only the file open then)."""
        fd, ident = self._open()
        if self._fd >= 0:
            if self._unsynced:
                try:
                    os.fsync(self._fd)
                except OSError as err:
                    self.failures += 1  # what it announced waits (sync raises)
                    _count_failure()
                    self._error = err
            os.close(self._fd)
        self._fd, self._id, self._end, self._unsynced = fd, ident, -1, False

    def emit(self, event: MutableMapping[str, Any], line: bytes) -> None:
        self.write_lines([line])

    def write_lines(self, lines: list[bytes]) -> None:
        """Append ``lines`` in one write, whole or not at all; never raises (see :meth:`sync`)."""
        try:
            self._append(b"".join(lines))
        except OSError as err:
            self.failures += len(lines)
            _count_failure(len(lines))
            self._error = err
            self._writing.failed(
                err,
                "nothing is carried out while it cannot be written (the files wait, deferred); "
                "events go on to the other sinks",
            )
            return
        if self._writing.failing:
            self._writing.recovered()

    def _append(self, lines: bytes) -> None:
        """Write ``lines`` (whole lines, one or more) into the file the path names, in one write
        under its lock; else raise."""
        if self._fd < 0:
            raise OSError(errno.EBADF, "the decision log file is closed", self._name)
        for _ in range(_FOLLOWS):
            fd = self._fd
            # After one wait in vain, the next events try once until the lock is had again: a
            # run's every event waiting its full patience would make a stop take minutes.
            try:
                _lock(fd, self._name, 0.0 if self._lock_stuck else LOCK_PATIENCE)
            except OSError:
                self._lock_stuck = True
                raise
            self._lock_stuck = False
            try:
                if self._append_locked(fd, lines):
                    return
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._reopen()  # rotated or removed by another process (or just now, by this one)
        raise OSError(errno.EAGAIN, "rotated away by other processes at every try", self._name)

    def _append_locked(self, fd: int, lines: bytes) -> bool:
        """With ``fd``'s lock held: write (or rotate); False when the path names another file."""
        try:
            st = os.stat(self._name)
        except FileNotFoundError:
            return False  # removed: start a new file, as a restart would
        if (st.st_dev, st.st_ino) != self._id:
            return False
        size = st.st_size
        if (
            self._rotates
            and size
            and size + len(lines) >= self._max_bytes
            and time.monotonic() >= self._rotate_after
            and self._rotate()
        ):
            return False  # the lines go into the new file, together
        data = lines
        if size and size != self._end and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + lines  # end a torn line: it is skipped as not JSON, not glued to these
        self._write(fd, data, size)
        self._end = size + len(data)
        self._unsynced = True
        return True

    def _write(self, fd: int, data: bytes, size: int) -> None:
        """Append ``data`` whole, or leave the file as it was (``size``) and raise."""
        written = 0
        try:
            while written < len(data):  # a signal or a nearly full disk: write the rest
                done = os.write(fd, data[written:] if written else data)
                if not done:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)
                written += done
        except OSError:
            if written:
                try:
                    os.ftruncate(fd, size)  # no line is counted, or left, half-written
                except OSError:
                    self._end = -1  # the next append (of any process) ends the torn line
            raise

    def _rotate(self) -> bool:
        """Rename the files one down, with the current one's lock held; True when done."""
        base = self._name
        try:
            for i in range(self._backups - 1, 0, -1):
                try:
                    fsio.rename(f"{base}.{i}", f"{base}.{i + 1}")
                except FileNotFoundError:
                    continue  # fewer backups so far than allowed
            fsio.rename(base, f"{base}.1")
        except OSError as err:
            # Keep appending beyond max_bytes rather than losing events; try again later.
            self._rotate_after = time.monotonic() + _ROTATE_RETRY
            self._rotating.failed(err, "appending to it beyond max_bytes")
            return False
        if self._rotating.failing:
            self._rotating.recovered()
        return True

    @property
    def failing(self) -> bool:
        """Whether its last write failed (``status`` and the metrics report it)."""
        return self._writing.failing

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def sync(self, since: int) -> None:
        """Make the events written so far durable, before the changes they announce.

        Raises :class:`~memstaged.errors.LogUnwritable` when an event since the mark ``since``
        (:attr:`failures` then) was not written, or the fsync fails: the caller must not carry
        out what they announce.
        """
        if self.failures != since:
            assert self._error is not None
            raise LogUnwritable(self.path, self._error)
        try:
            os.fsync(self._fd)
            self._unsynced = False
            if self._dir_changed:
                fsio.sync_dir(self.path.parent)
                self._dir_changed = False
        except OSError as err:
            self.failures += 1
            _count_failure()
            self._error = err
            self._writing.failed(err, "nothing is carried out while it cannot be made durable")
            raise LogUnwritable(self.path, err) from None


#: What a file system that cannot take the log now says (full, read-only, failing): a command
#: that cannot open the log for it changes nothing and exits 1 (try again), not 2 (a setting).
UNWRITABLE: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def open_error(path: Path, err: OSError) -> MemstagedError:
    """The one-line error of a log file that cannot be opened: try again, or fix a setting."""
    if err.errno in UNWRITABLE:
        return LogUnwritable(path, err)
    return ConfigError(f"log file {path}: {err.strerror or err}")


def not_a_log_file(mode: int) -> str:
    """Why a path cannot be the decision log, for a mode that is not a regular file's."""
    return (
        f"not a regular file ({safe_text.file_kind(mode)}): the decision log must be a regular "
        "file, or a path where one can be created"
    )


def _lock(fd: int, name: str, patience: float) -> None:
    """``flock(LOCK_EX)`` on the log, waiting at most ``patience`` seconds; else ``OSError``.

    Only a contended lock waits (:func:`memstaged.files.fsio.flock_within`); an idle daemon takes
    none.
    """
    if fsio.flock_within(fd, patience):
        return
    raise OSError(
        errno.EWOULDBLOCK,
        f"locked by another process for over {LOCK_PATIENCE:g} s (a stopped memstaged?)",
        name,
    )
