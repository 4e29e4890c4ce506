"""A file read ahead of its decision (:mod:`memstaged.run.read_ahead`), on real files in a temp
dir, in this process: read only while the reconciler's lock is known to be free, an error kept
for where the file is decided, and a version read ahead let go of its descriptor.

The read-ahead of a whole ``--once`` run, with decider processes, a lock taken during a commit
and writers racing it, is in ``tests/system/`` (test_deciders.py, test_read_ahead_attack.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import context_for

from memstaged.core.decide import Context
from memstaged.files.locks import LockInfo
from memstaged.files.version import Version
from memstaged.run.read_ahead import LockSeen, job, read_ahead, release

LIMIT = 1024 * 1024


@pytest.fixture
def staging_fd(memory_dir: Path) -> Iterator[int]:
    """``staging/`` of a memory dir holding ``a.json``, opened as the pipeline opens it."""
    (memory_dir / "staging" / "a.json").write_bytes(b'{"a": 1}')
    fd = os.open(memory_dir / "staging", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _free() -> LockSeen:
    lock = LockSeen()
    lock.known = True
    return lock


def test_a_file_read_ahead_holds_its_version_and_context_until_released(
    memory_dir: Path, staging_fd: int
) -> None:
    """While the lock is known to be free, a staging file is read ahead with the context it is
    decided in: a decider process gets its bytes in that context; released, its descriptor is
    closed and there is nothing left to decide."""
    ctx = context_for(memory_dir, "a.json")
    read = read_ahead("a.json", staging_fd, _free(), LIMIT, lambda _v: (ctx, 12.5))
    assert isinstance(read.read, Version)
    version = read.read
    assert (read.name, read.ctx, read.changed_at) == ("a.json", ctx, 12.5)
    assert job(read) == (b'{"a": 1}', ctx)
    release(read)
    assert version.fd == -1
    assert read.read is None
    assert job(read) is None


@pytest.mark.parametrize(
    ("known", "blocked", "name"),
    [
        (False, None, "a.json"),  # the lock could not be read
        (True, LockInfo(pid=1, owner="reconciler", alive=True, ino=1), "a.json"),  # it is held
        (True, None, ".a.json"),  # a writer's temp: not a staging file name
    ],
)
def test_nothing_is_read_while_the_lock_is_held_or_unknown_nor_a_name_never_decided(
    staging_fd: int, known: bool, blocked: LockInfo | None, name: str
) -> None:
    """SPEC 5: no file is read ahead unless the reconciler's lock is known to be free, and SPEC 6:
    a name that is not a staging file's is never opened; such a file is read, or skipped, where
    it is decided."""
    lock = LockSeen()
    lock.known, lock.blocked = known, blocked

    def context(_version: Version) -> tuple[Context, float]:
        raise AssertionError("no context is settled for a file not read")

    read = read_ahead(name, staging_fd, lock, LIMIT, context)
    assert read.read is None
    assert read.ctx is None
    assert job(read) is None
    release(read)  # nothing to let go of


def test_an_error_reading_ahead_is_kept_for_where_the_file_is_decided(staging_fd: int) -> None:
    """An error while reading ahead is not raised there (it would stop the files ahead of it):
    it is kept, raised again where the file is decided, in order; the version already opened is
    closed."""
    opened: list[Version] = []

    def context(version: Version) -> tuple[Context, float]:
        opened.append(version)
        raise RuntimeError("a bug settling the context")

    read = read_ahead("a.json", staging_fd, _free(), LIMIT, context)
    assert isinstance(read.read, RuntimeError)
    assert [v.fd for v in opened] == [-1]
    assert job(read) is None
