"""Dead-letter records an operator has seen (``memstaged deadletter ack``).

A quarantine is a normal outcome: once someone has looked at a record, ``status`` and
``status --check`` should stop asking for attention because of it, without the record being
deleted (it is still what ``recover`` works from). The mark is kept in memstaged's own state
dir, one small JSON file per memory dir under ``$XDG_STATE_HOME/memstaged/acked/``, never in the
memory dir (SPEC 6: memstaged touches nothing there but what it decides; the reconciler and the
agent's tools read ``deadletter/``).

A record is named by its file name, which holds its hash and is never reused for other bytes,
so the mark needs no more than the names. Names of records gone from ``deadletter/`` (recovered,
purged) are dropped when the file is next written. Like the seen cache, it is only memstaged's
bookkeeping: lost, it only means the records are reported as unseen again.

The file is read, changed and written only by :func:`mark`, under an exclusive ``flock`` on
``acked/`` itself (a directory in the user's private state dir: no other user can open it, and
no lock file is left), so that marks made at once by several ``deadletter ack`` are all kept.
Readers (``status``, the metrics) take no lock: the file is replaced whole by a rename.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, NamedTuple

import msgspec

from memstaged import safe_text
from memstaged.core import digests
from memstaged.deadletter.store import is_record_name
from memstaged.errors import BusyError, ConfigError
from memstaged.files import atomic_write, fsio, private_dirs, safe_open
from memstaged.files.locks import flock_holder
from memstaged.files.memdir import DEADLETTER, MemoryDir

ACKED_DIR: Final = "acked"
#: A mark file larger than this is not one memstaged wrote: it is ignored (all unseen).
_MAX_SIZE: Final = 64 * 1024 * 1024
#: How long a change of the marks waits for another one to end. Each holds the lock for a read,
#: a write and a rename; past this the holder is stuck (a ``deadletter ack`` stopped by Ctrl-Z).
LOCK_PATIENCE: Final = 5.0


class _MarksFile(msgspec.Struct, frozen=True):
    memory_dir: str
    #: Record names, sorted (a stable file). A name that is not UTF-8 is kept as
    #: ``os.fsdecode`` gives it, which JSON cannot encode: such names are left out (unseen).
    seen: list[str]


_decoder: Final = msgspec.json.Decoder(_MarksFile)


def file_name(memory_dir: str) -> str:
    """The marks' file name in ``acked/`` (a hash of the memory dir's path, as the seen cache)."""
    return digests.sha256(os.fsencode(memory_dir)).hexdigest()[:24] + ".json"


def load(state_dir: Path | None, memory_dir: str) -> set[str]:
    """The names of the records of ``memory_dir`` marked seen (empty when none, or unreadable)."""
    if state_dir is None:
        return set()
    try:
        with private_dirs.state_subdir(state_dir, ACKED_DIR, create=False) as fd:
            return _load_at(fd, memory_dir)
    except OSError:
        return set()  # none, or not a directory of the user's own


def _load_at(acked_fd: int, memory_dir: str) -> set[str]:
    try:
        data = safe_open.read_private(file_name(memory_dir), _MAX_SIZE, dir_fd=acked_fd)
    except OSError:
        return set()  # none, or not a file memstaged wrote (a FIFO, a link, too large)
    try:
        stored = _decoder.decode(data)
    except msgspec.DecodeError:
        return set()
    if stored.memory_dir != _label(memory_dir):
        return set()  # a hash collision, or a file copied from elsewhere: not these records
    return set(stored.seen)


class Marked(NamedTuple):
    """What :func:`mark` did in one memory dir."""

    #: Records marked seen now.
    marked: int
    #: Records marked seen, those of before included.
    seen: int
    #: Records not seen.
    unseen: int
    #: Whether the file was written (new marks, or marks of records gone dropped).
    changed: bool


def mark(state_dir: Path, mdir: MemoryDir, chosen: Iterable[str] | None) -> Marked:
    """Mark the records ``chosen`` (names; ``None``: every record) of ``mdir`` seen, and drop the
    marks of records gone: one read-modify-write under the marks' lock.

    The records are listed under the lock too, so that a mark made meanwhile by another ack is
    never dropped as a record gone. A name that is no record now is not marked. Raises
    :class:`ConfigError` when ``deadletter/`` cannot be listed or the marks cannot be kept, and
    :class:`BusyError` when another process holds the lock past :data:`LOCK_PATIENCE`.
    """
    try:
        with _locked(state_dir) as acked_fd:
            try:
                present = set(record_names(mdir))
            except OSError as err:
                where = safe_text.name(mdir.path)
                raise ConfigError(f"{where}/deadletter: {err.strerror}") from None
            stored = _load_at(acked_fd, mdir.path)
            seen = stored & present
            new = present - seen if chosen is None else (set(chosen) & present) - seen
            changed = bool(new) or seen != stored
            if changed:
                _save(acked_fd, mdir.path, seen | new)
    except OSError as err:
        where = safe_text.name(str(state_dir))
        raise ConfigError(f"cannot keep the marks in {where}: {err.strerror}") from None
    return Marked(len(new), len(seen) + len(new), len(present - seen - new), changed)


@contextmanager
def _locked(state_dir: Path) -> Iterator[int]:
    """The descriptor of ``acked/`` (made 0700 if missing, refused when it or the state dir is
    not the user's own and private), with an exclusive ``flock`` on it for the block."""
    with private_dirs.state_subdir(state_dir, ACKED_DIR, create=True) as fd:
        if not fsio.flock_within(fd, LOCK_PATIENCE):
            directory = state_dir / ACKED_DIR
            pid = flock_holder(os.fstat(fd))
            holder = f"pid {pid}" if pid else "another process"
            raise BusyError(
                f"the dead-letter marks in {safe_text.name(str(directory))} have been locked by "
                f"{holder} for over {LOCK_PATIENCE:g} s (a stopped memstaged deadletter ack?); "
                "nothing was marked"
            )
        yield fd  # closing our only descriptor of it (on leaving) drops the flock


def _save(acked_fd: int, memory_dir: str, seen: Iterable[str]) -> None:
    """Write the marks (temp file, 0600, rename: a reader never sees half of it), under the lock.

    Raises :class:`OSError`: unlike the seen cache, a mark an operator asked for and that was
    not kept must be said.
    """
    names = sorted(n for n in set(seen) if _encodable(n))
    data = msgspec.json.encode(_MarksFile(_label(memory_dir), names))
    atomic_write.replace_at(acked_fd, file_name(memory_dir), data)


def _label(memory_dir: str) -> str:
    """The memory dir's path as JSON can hold it, whatever its bytes."""
    return os.fsencode(memory_dir).decode("utf-8", "backslashreplace")


def _encodable(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def record_names(mdir: MemoryDir) -> list[str]:
    """The names of the records in ``deadletter/`` now (opened without following a link);
    raises :class:`OSError` when it cannot be listed, ``[]`` when there is none."""
    try:
        with fsio.opened_dir(mdir.path) as mem_fd, fsio.opened_dir(DEADLETTER, mem_fd) as dl_fd:
            return sorted(n for n in os.listdir(dl_fd) if is_record_name(n))
    except (FileNotFoundError, NotADirectoryError):
        return []


def unseen(names: Iterable[str], seen: set[str]) -> int:
    """How many of ``names`` are not marked seen."""
    return sum(1 for name in names if name not in seen)
