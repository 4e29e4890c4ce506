"""Dead-letter records an operator has seen (``memstaged deadletter ack``), issue 21 item 6.

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
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import msgspec

from memstaged import digests, fsio
from memstaged.deadletter import is_record_name
from memstaged.memdir import DEADLETTER, MemoryDir

ACKED_DIR: Final = "acked"
#: A mark file larger than this is not one memstaged wrote: it is ignored (all unseen).
_MAX_SIZE: Final = 64 * 1024 * 1024


class _Stored(msgspec.Struct, frozen=True):
    memory_dir: str
    #: Record names, sorted (a stable file). A name that is not UTF-8 is kept as
    #: ``os.fsdecode`` gives it, which JSON cannot encode: such names are left out (unseen).
    seen: list[str]


_decoder: Final = msgspec.json.Decoder(_Stored)


def acked_path(state_dir: Path, memory_dir: str) -> Path:
    """Where the marks of ``memory_dir`` live (named by a hash of its path, as the seen cache)."""
    name = digests.sha256(os.fsencode(memory_dir)).hexdigest()[:24]
    return state_dir / ACKED_DIR / f"{name}.json"


def load(state_dir: Path | None, memory_dir: str) -> set[str]:
    """The names of the records of ``memory_dir`` marked seen (empty when none, or unreadable)."""
    if state_dir is None:
        return set()
    path = acked_path(state_dir, memory_dir)
    try:
        data = fsio.read_private(path, _MAX_SIZE)
    except OSError:
        return set()  # none, or not a file memstaged wrote (a FIFO, a link, too large)
    try:
        stored = _decoder.decode(data)
    except msgspec.DecodeError:
        return set()
    if stored.memory_dir != _label(memory_dir):
        return set()  # a hash collision, or a file copied from elsewhere: not these records
    return set(stored.seen)


def save(state_dir: Path, memory_dir: str, seen: Iterable[str]) -> None:
    """Write the marks (temp file, 0600, rename: a reader never sees half of it).

    Raises :class:`OSError`: unlike the seen cache, a mark an operator asked for and that was
    not kept must be said.
    """
    path = acked_path(state_dir, memory_dir)
    fsio.private_dirs(path.parent)
    names = sorted(n for n in set(seen) if _encodable(n))
    data = msgspec.json.encode(_Stored(_label(memory_dir), names))
    fsio.replace_file(path, data)


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
