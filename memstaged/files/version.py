"""Step 1 of the flow: read one version of a staging file safely (SPEC sections 5 and 6).

A :class:`Version` is the bytes memstaged decides on and the open descriptor of the inode they
came from. The descriptor stays open until the decision is carried out, so that the inode number
cannot be freed and reused by a writer's next temp file meanwhile; with the
ctime in the :class:`~memstaged.files.fsio.Identity`, an in-place rewrite that restores the mtime is
seen too. Opening never follows a link and never blocks on a FIFO. A read lease on the
descriptor (:meth:`Version.lease`, taken once the version is to be changed) makes a writer that
opens the file to write wait until the descriptor is closed, and tells memstaged that one is
waiting (SPEC 5: concurrent writers).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import threading
from collections import OrderedDict
from typing import Final

import msgspec

from memstaged.files import fsio, safe_open
from memstaged.files.fsio import Identity

#: The reason of a file that is gone before it could be read (``skipped``).
VANISHED: Final = "vanished before it could be read"
#: How the reason of a file memstaged may not read begins (``deferred``, SPEC 5).
CANNOT_READ: Final = "cannot read it"

#: How many versions with a future mtime :class:`FirstSeen` remembers (a bounded memory).
_FIRST_SEEN_MAX: Final = 4096


class Version:
    """One version of ``staging/<name>``: its open descriptor, identity and bytes.

    ``data`` is ``None`` when the file is larger than the size limit: it is then never read.
    Close it (or use it as a context manager) once its decision is carried out.
    """

    __slots__ = ("data", "fd", "identity", "leased", "mtime", "name")

    def __init__(
        self, name: str, fd: int, st: os.stat_result, data: bytes | None, *, leased: bool = False
    ) -> None:
        self.name = name
        self.fd = fd
        self.identity = Identity.of(st)
        self.mtime = st.st_mtime
        self.data = data
        #: A read lease is held on :attr:`fd` (:meth:`lease`).
        self.leased = leased

    def lease(self) -> bool:
        """Take the read lease, before this version's decision is carried out (SPEC 5:
        concurrent writers); False when another process has the file open for writing now.

        Taken only where the file will change: a version left as it is needs none. A writer
        that wrote into the file between the read and the lease is no loss: it wrote into this
        inode, and the bytes read back through :attr:`fd` before the version is let go
        (:meth:`is_displaced`) are then not the bytes decided. Where no lease can be had, the
        decision is carried out without one.
        """
        if self.leased:
            return True
        taken = read_lease(self.fd)
        if taken is None:
            return False
        self.leased = taken
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Version:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def still_in_place(self, staging_fd: int) -> bool | None:
        """``True`` while ``name`` holds this version; ``False`` if another; ``None`` if gone."""
        current = fsio.lstat_at(staging_fd, self.name)
        if current is None:
            return None
        return Identity.of(current) == self.identity

    def is_displaced(self, dir_fd: int, name: str) -> bool:
        """Is ``name`` (what a rename of ours just displaced) still exactly this version?

        Our own rename changed its ctime, so what is compared is the inode (which cannot have
        been reused: :attr:`fd` holds it), its size and mtime, and the bytes themselves: a
        writer that changed the file in place within one tick of the clock leaves even the
        ctime as it was. And a writer waiting to open it for writing (on the read lease) means
        it is not: that writer's bytes would land in a file about to be let go.
        """
        if self.leased and writer_waiting(self.fd):
            return False  # a writer is opening it to write: what it writes must not be lost
        st = fsio.lstat_at(dir_fd, name)
        ident = self.identity
        if st is None or (st.st_dev, st.st_ino) != (ident.dev, ident.ino):
            return False
        if (st.st_size, st.st_mtime_ns) != (ident.size, ident.mtime_ns):
            return False
        if self.data is None:
            return True  # never read (too large): the identity is all there is
        return safe_open.read_fd_at(self.fd, len(self.data) + 1) == self.data


class Skip(msgspec.Struct, frozen=True):
    """Why an entry is not read: ``skipped`` (not a staging file) or ``deferred`` (retry)."""

    decision: str
    reason: str
    identity: Identity | None = None


def skip_reason(st: os.stat_result) -> str | None:
    """Why an entry named like a staging file is not one (SPEC 6), or ``None`` for a file."""
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link: never followed"
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a staging file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (FIFO, socket or device)"
    return None


def quiet_lease_breaks() -> None:
    """Ignore ``SIGIO``, the notice a broken lease sends (its default action ends the process),
    for the rest of the process's life: called by ``--once`` and the daemon as they start. The
    decider processes they start inherit it, and take no lease. From a thread other than the
    main one no handler can be set, and each lease names ``SIGURG`` instead (one more call)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGIO, signal.SIG_IGN)


def read_lease(fd: int) -> bool | None:
    """Take a read lease on a version memstaged is deciding (SPEC 5: concurrent writers).

    While it is held, another process's ``open`` for writing (``cp -p`` onto the file, ``rsync
    --inplace``) waits until the descriptor is closed, and :func:`writer_waiting` tells that
    one is waiting: the version is then kept as a conflict, never let go, so what the writer
    writes next lands in a file that stays. The break notice is ``SIGIO``, ignored once
    :func:`quiet_lease_breaks` ran; until then each lease names ``SIGURG``, whose default is to
    be ignored. Returns ``True`` when taken, ``None`` when another process has the file open
    for writing right now (it is being written), and ``False`` when the file system or the
    file's owner allows no lease (NFS, a file of another user): memstaged then decides without
    one, as before.
    """
    try:
        if signal.getsignal(signal.SIGIO) is not signal.SIG_IGN:
            fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as err:
        return None if err.errno == errno.EAGAIN else False
    return True


def writer_waiting(fd: int) -> bool:
    """Whether a writer is waiting to open the file a read lease is held on (it is broken)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
    except OSError:
        return True  # cannot tell: keep the version


#: The reason of a file another process has open for writing (``deferred``, SPEC 5).
BEING_WRITTEN: Final = "open for writing by another process: still being written"


def read_version(staging_fd: int, name: str, limit: int) -> Version | Skip:
    """Open and read ``staging/<name>``; the caller closes the :class:`Version`.

    Only the open is mapped to skipped or deferred; any other error is raised, for the caller to
    log and retry as an I/O error.
    """
    # lstat first, just before the open: a device is never opened (opening one can have
    # effects), nor a FIFO (a writer blocked in its open would be let through). A listing's
    # file type is no substitute: it may be seconds old by the time a name is opened.
    seen = fsio.lstat_at(staging_fd, name)
    if seen is None:
        return Skip("skipped", VANISHED)
    reason = skip_reason(seen)
    if reason is not None:
        return Skip("skipped", reason, Identity.of(seen))
    try:
        fd, st = safe_open.open_regular_fd(staging_fd, name)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return Skip("skipped", VANISHED)
        if err.errno in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
            return Skip("skipped", "replaced by a link or special file")
        if err.errno in (errno.EACCES, errno.EPERM):
            return Skip("deferred", f"{CANNOT_READ}: permission denied")
        raise
    try:
        data = None if st.st_size > limit else safe_open.read_fd(fd, st.st_size, limit)
        leased: bool | None = False
        if data is None:  # never read, so always moved: leased now, its identity taken after
            leased = read_lease(fd)
            if leased is None:
                os.close(fd)
                return Skip("deferred", BEING_WRITTEN)
            st = os.fstat(fd)  # it may have grown past the limit while being read
    except BaseException:
        os.close(fd)
        raise
    return Version(name, fd, st, data, leased=bool(leased))


class FirstSeen:
    """When memstaged first saw a version whose mtime lies in the future (SPEC 5).

    Such a file settles counting from that moment, not from its mtime: a file dated a day ahead
    would otherwise be re-read and logged ``deferred`` for a whole day.
    """

    def __init__(self) -> None:
        self._seen: OrderedDict[Identity, float] = OrderedDict()

    def changed_at(self, version: Version, now: float) -> float:
        """The time the version counts as last changed: its mtime, or when first seen."""
        if version.mtime <= now:
            return version.mtime
        first = self._seen.setdefault(version.identity, now)
        if len(self._seen) > _FIRST_SEEN_MAX:
            self._seen.popitem(last=False)
        return first
