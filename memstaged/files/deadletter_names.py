"""The dead-letter store's names (SPEC 4): where each record and original of a plan goes.

Nothing already under ``deadletter/`` is trusted: a name is used as it is planned only when it
is free; when it holds the very same bytes, they are kept and their age refreshed; when it holds
an earlier record of the same quarantine, that record is replaced (refreshing its age); anything
else (another file, a link, a FIFO, something unreadable) makes the file take another name,
``<stem>.<n>.json`` (``<name>.<n>`` for an original). :mod:`memstaged.files.transaction` settles
every name with these functions under ``canonical-writer.lock`` and then gives each durable temp its
name with :func:`install`.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Final, NamedTuple

from memstaged.core.records import ORIGINALS_DIR, DeadLetter
from memstaged.files import fsio, safe_open
from memstaged.files.memdir import DEADLETTER

#: How many other names are tried for a dead-letter file whose name is taken.
_ALT_NAMES: Final = 100


class Written(NamedTuple):
    """A record's durable temp in ``deadletter/``: its name and the size of its bytes.

    Under the lock a record is not rendered again (SPEC 4: one record in memory at a time):
    what is at its name is compared with the temp, on disk.
    """

    tmp: str
    size: int


class File(NamedTuple):
    """A dead-letter file to put in place: where, its final name, how, and its durable temp."""

    dir_fd: int
    name: str
    #: "install" (the name is free), "refresh" (it holds these bytes), "replace" (it holds an
    #: earlier record of the same quarantine).
    how: str
    #: The temp written and made durable before (None: a refresh needs none).
    tmp: str | None


class Names:
    """The dead-letter names of one transaction as they are settled: those given out so far
    (:attr:`taken`), and what is at a name.

    Under the lock, ``deadletter/`` and ``originals/`` may be listed once (:meth:`list`): a name
    the listing does not hold is free, with no look of its own. A directory holding more than
    a few times the files to settle is not listed (the listing would cost more than it saves):
    each name is then looked at (``lstat``). A name taken since the listing (by someone outside
    memstaged: nothing of memstaged's writes there without the lock) makes its
    ``RENAME_NOREPLACE`` fail, and the transaction stops as for any I/O error.
    """

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self._listed: dict[int, frozenset[str]] = {}

    def list(self, dir_fd: int, most: int) -> None:
        """List ``dir_fd``, unless it holds more than ``most`` entries."""
        names: list[str] = []
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if len(names) >= most:
                    return
                names.append(entry.name)
        self._listed[dir_fd] = frozenset(names)

    def present(self, dir_fd: int, name: str) -> bool:
        """Whether something is at ``name`` (taken in this transaction or not)."""
        listed = self._listed.get(dir_fd)
        if listed is not None:
            return name in listed
        return fsio.lstat_at(dir_fd, name) is not None


class Store:
    """``deadletter/`` and ``originals/`` of one transaction, opened (and created) on first use."""

    def __init__(self, mem_fd: int) -> None:
        self.mem_fd = mem_fd
        self.fds: tuple[int, int] | None = None

    def open(self) -> tuple[int, int]:
        if self.fds is None:
            try:
                dl_fd = fsio.open_dir(DEADLETTER, self.mem_fd, create=True)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(
                        err.errno,
                        "deadletter/ is a symbolic link or not a directory: never followed",
                    ) from None
                raise
            try:
                or_fd = fsio.open_dir(ORIGINALS_DIR, dl_fd, create=True)
            except OSError as err:
                os.close(dl_fd)
                if err.errno in (errno.ELOOP, errno.ENOTDIR):
                    what = "deadletter/originals/ is a symbolic link or not a directory"
                    raise OSError(err.errno, f"{what}: never followed") from None
                raise
            self.fds = (dl_fd, or_fd)
        return self.fds

    def close(self) -> None:
        for fd in self.fds or ():
            os.close(fd)
        self.fds = None


def _holds(dir_fd: int, name: str, body: bytes, names: Names) -> bool | None:
    """Is ``name`` a regular file with exactly ``body``? ``None`` when the name is free."""
    if not names.present(dir_fd, name):
        return None
    try:
        with safe_open.open_regular(dir_fd, name) as (fd, fst):
            return fst.st_size == len(body) and safe_open.read_fd_at(fd, len(body) + 1) == body
    except OSError:
        return False  # a link, a FIFO, unreadable: not ours to trust


def _holds_written(dir_fd: int, name: str, written: Written, names: Names) -> bool | None:
    """Is ``name`` a regular file with exactly the bytes of the temp ``written``? ``None``: free.

    Compared on disk, in bounded chunks: under the lock no record is rendered (SPEC 4, 5).
    """
    if not names.present(dir_fd, name):
        return None
    try:
        with safe_open.open_regular(dir_fd, name) as (fd, fst):
            if fst.st_size != written.size:
                return False
            with safe_open.open_regular(dir_fd, written.tmp) as (tmp_fd, _tst):
                return safe_open.hash_fd(fd) == safe_open.hash_fd(tmp_fd)
    except OSError:
        return False  # a link, a FIFO, unreadable: not ours to trust


def _same_quarantine(dir_fd: int, name: str, record: DeadLetter, original: str, size: int) -> bool:
    """Is ``name`` a record memstaged wrote for the same bytes (an earlier quarantine of them)?

    ``size`` is the size of the record as it is now rendered.
    """
    try:
        with safe_open.open_regular(dir_fd, name) as (fd, fst):
            if fst.st_size > 4 * size + 65536:
                return False
            old = json.loads(safe_open.read_fd_at(fd, fst.st_size + 1))
    except (OSError, ValueError):
        return False
    if not isinstance(old, dict) or not isinstance(old.get("memstaged"), dict):
        return False
    marks = record.marks(original)
    keys = ("sha256", "source_file", "original")
    return (
        all(old["memstaged"].get(k) == marks[k] for k in keys)
        and old.get("category") == marks["category"]
    )


def _alt_name(dir_fd: int, name: str, names: Names) -> str:
    """Another free name for ``name``: ``<stem>.<n>.json``, ``<stem>.<n>.orig``."""
    base, dot, ext = name.rpartition(".")
    for n in range(2, _ALT_NAMES + 2):
        alt = f"{base}.{n}.{ext}" if dot else f"{name}.{n}"
        if alt not in names.taken and not names.present(dir_fd, alt):
            return alt
    raise OSError(errno.EEXIST, "no free name in deadletter/", name)


def settle_original(
    or_fd: int,
    planned: str,
    names: Names,
    *,
    data: bytes | None,
    tmp: str | None,
    renamed: bool,
) -> tuple[str, File | None]:
    """The original's name that is safe to use, and the file to put there (``None``: a move).

    ``renamed``: the original is the staging file itself, renamed there (``tmp``: its copy,
    when a rename is impossible). Otherwise it holds ``data``, written to ``tmp`` (a name
    already holding exactly ``data`` is kept, its age refreshed). Run once before the lock (so
    that the records are rendered for the name they will most likely keep) and again under it,
    where what is at the name is checked for real.
    """
    name, file = planned, None
    if renamed:
        if name in names.taken or names.present(or_fd, name):
            name = _alt_name(or_fd, name, names)
        if tmp is not None:
            file = File(or_fd, name, "install", tmp)
    else:
        assert data is not None
        held = _holds(or_fd, name, data, names) if name not in names.taken else False
        if held is False:
            name = _alt_name(or_fd, name, names)
        file = File(or_fd, name, "refresh" if held else "install", tmp)
    names.taken.add(name)
    return name, file


def settle_record(
    dl_fd: int, record: DeadLetter, original: str | None, written: Written, names: Names
) -> File:
    """The record's file, under a name that is safe to use (its temp ``written`` is durable)."""
    name = record.name
    held = _holds_written(dl_fd, name, written, names) if name not in names.taken else False
    how = "refresh" if held else "install"
    if held is False:
        pointed = original if original is not None else record.original
        if name not in names.taken and _same_quarantine(dl_fd, name, record, pointed, written.size):
            how = "replace"
        else:
            name = _alt_name(dl_fd, name, names)
    names.taken.add(name)
    return File(dl_fd, name, how, None if held else written.tmp)


def install(file: File) -> None:
    """Give a complete, durable temp its final name; refresh the age of what is kept (SPEC 4)."""
    if file.how == "refresh" or file.tmp is None:
        os.utime(file.name, dir_fd=file.dir_fd, follow_symlinks=False)
    elif file.how == "replace":
        os.rename(file.tmp, file.name, src_dir_fd=file.dir_fd, dst_dir_fd=file.dir_fd)
    else:
        fsio.rename_noreplace(file.dir_fd, file.tmp, file.dir_fd, file.name)
