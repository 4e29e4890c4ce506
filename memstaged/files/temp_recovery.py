"""Crash recovery of temp files: undo exactly what a killed transaction may leave (SPEC 5, 6).

Run when memstaged starts on a memory dir (the daemon, ``--once``), before anything is decided
there. Every temp file memstaged makes carries :data:`memstaged.files.temp_names.TEMP_PREFIX` and a
role (:func:`memstaged.files.temp_names.temp_name`); a newer memstaged cleans up an older one's
leftovers by those names alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from memstaged.core.decide import Context, decide
from memstaged.core.records import ORIGINALS_DIR
from memstaged.errors import os_reason
from memstaged.files import fsio, safe_open, temp_names
from memstaged.files.locks import lock_to_obey
from memstaged.files.memdir import DEADLETTER, STAGING, MemoryDir, Options
from memstaged.files.staging_swap import park


class Recovery(msgspec.Struct, frozen=True):
    """What :func:`recover_temps` needs besides the memory dir: how to log, and how to decide
    whether a temp is the repair of a file (or a file the repair of it)."""

    log: Any
    project_root: str
    split_invalid_candidates: bool
    #: Files larger than this are not read (SPEC 6): only compared by hash.
    limit: int
    #: Names the ``.conflict-`` file a temp is kept as.
    now: float

    def one_repairs_other(self, ours: bytes, current: bytes) -> bool:
        ctx = Context(
            self.project_root,
            "recovered.json",
            settled=True,
            split_invalid_candidates=self.split_invalid_candidates,
        )
        return decide(ours, ctx).new_bytes == current or decide(current, ctx).new_bytes == ours


@contextmanager
def _opened(sub: str, mem_fd: int) -> Iterator[int | None]:
    try:
        fd = fsio.open_dir(sub, mem_fd) if sub != "." else os.dup(mem_fd)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def recover_memory_dir(mdir: MemoryDir, log: Any, options: Options, now: float) -> list[str] | None:
    """:func:`recover_temps` in ``mdir``, opened without following a link; a stop by an I/O
    error is logged. ``None`` when it cannot be opened (whoever decides its files says why)."""
    try:
        mem_fd = mdir.open()
    except OSError:
        return None
    how = Recovery(
        log, mdir.project_root, options.split_invalid_candidates, options.max_file_size, now
    )
    try:
        return recover_temps(mem_fd, how)
    except OSError as err:
        log.error("temp_recovered", memory_dir=mdir.path, action=f"stopped: {os_reason(err)}")
        return None
    finally:
        os.close(mem_fd)


def recover_temps(mem_fd: int, how: Recovery) -> list[str] | None:
    """Clean up what a killed memstaged left: delete only what is provably redundant.

    A stale ``canonical-writer.lock`` of memstaged's own is removed first (SPEC 5: at start, not
    only when a file is next decided there). A temp file in the memory dir (a
    lock being taken) or in ``deadletter/`` only ever holds memstaged's own lock, record or
    copy: it is deleted. A temp file in ``staging/`` may hold a writer's version that was
    displaced at the moment of the crash, so it is deleted only when the same bytes (or their
    repair) are safe elsewhere; otherwise it is kept as a new staging file and decided on its
    own. A temp in ``staging/`` whose ``flock`` a live process holds (a recovery running beside
    this daemon, between writing its new staging file and naming it) is no leftover: it is left
    alone, and nothing is logged about it. Every directory is opened one component at a time
    without following a link.

    Returns the listing of ``staging/`` when it had no temp file (the usual case), so that a
    scan need not list a directory of thousands of files a second time.
    """
    try:
        lock_to_obey(mem_fd, how.log)  # a stale one of memstaged's own is removed, and logged
    except FileNotFoundError:
        pass  # released meanwhile: nothing to clean up
    except OSError as err:
        how.log.error("lock_seen", lock="canonical-writer.lock", action=f"unreadable: {err}")
    for sub in (".", DEADLETTER, f"{DEADLETTER}/{ORIGINALS_DIR}"):
        with _opened(sub, mem_fd) as fd:
            if fd is None:
                continue
            deleted = 0
            left: dict[str, int] = {}  # why an entry could not be deleted -> how many
            for entry in os.listdir(fd):
                if temp_names.parse_temp_name(entry) is not None:
                    why = _delete(fd, entry)
                    if why is None:
                        deleted += 1
                    else:
                        left[why] = left.get(why, 0) + 1
            if deleted:  # one event: a stopped quarantine can leave 100,000 record temps
                how.log.info("temp_recovered", path=sub, deleted=deleted, action="deleted")
            for why, count in left.items():
                how.log.error("temp_recovered", path=sub, left=count, action=f"left alone: {why}")
    with _opened(STAGING, mem_fd) as staging_fd:
        if staging_fd is None:
            return None
        names = os.listdir(staging_fd)
        temps = sorted([n for n in names if n.startswith(temp_names.TEMP_PREFIX)])
        if not temps:
            return names
        for entry in temps:
            parsed = temp_names.parse_temp_name(entry)
            if parsed is None or fsio.temp_in_use(staging_fd, entry):
                continue  # a live recovery's new staging file, not yet named: not a leftover
            if parsed[0] == temp_names.PARTIAL:  # still being written: never anyone's version
                why = _delete(staging_fd, entry)
                path = f"{STAGING}/{entry}"
                if why is None:
                    how.log.info("temp_recovered", path=path, action="deleted")
                else:
                    how.log.error("temp_recovered", path=path, action=f"left alone: {why}")
                continue
            try:
                _recover_staging_temp(how, mem_fd, staging_fd, entry, parsed[1], names)
            except OSError as err:
                how.log.error(
                    "temp_recovered",
                    path=f"{STAGING}/{entry}",
                    action=f"left alone: {err.strerror or err}",
                )
    return None


def _delete(dir_fd: int, name: str) -> str | None:
    """Delete a leftover temp; why it cannot be (a directory of that name, another user's file
    in a sticky directory), or None. One such entry stops no other clean-up."""
    try:
        fsio.unlink_quietly(dir_fd, name)
    except OSError as err:
        return err.strerror or str(err)
    return None


def _snapshot(dir_fd: int, name: str, limit: int) -> tuple[str, bytes | None] | None:
    """sha256 and (unless larger than the size limit) the bytes of a regular file."""
    try:
        with safe_open.open_regular(dir_fd, name) as (fd, _st):
            sha, size = safe_open.hash_fd(fd)
            return sha, safe_open.read_fd(fd, size, limit) if size <= limit else None
    except FileNotFoundError:
        return None


def _recover_staging_temp(
    how: Recovery, mem_fd: int, staging_fd: int, entry: str, encoded: str, names: list[str]
) -> None:
    path = f"{STAGING}/{entry}"
    try:
        ours = _snapshot(staging_fd, entry, how.limit)
    except OSError as err:
        how.log.warning("temp_recovered", path=path, action=f"left alone: {err.strerror or err}")
        return
    if ours is None:
        return  # gone meanwhile
    sha, data = ours
    target = temp_names.resolve_target(encoded, names)
    theirs: tuple[str, bytes | None] | None = None
    if target is not None and target.endswith(".json") and not target.startswith("."):
        try:
            theirs = _snapshot(staging_fd, target, how.limit)
        except OSError:
            theirs = ("", None)  # something unreadable holds the name: keep ours beside it
    redundant = (theirs is not None and theirs[0] == sha) or _in_originals(mem_fd, sha)
    if not redundant and data is not None and theirs is not None and theirs[1] is not None:
        # One is the repair of the other: a rewrite that was (or was not yet) put in place.
        redundant = how.one_repairs_other(data, theirs[1])
    if redundant:
        fsio.unlink_quietly(staging_fd, entry)
        action = "deleted: the same content is in staging/ or deadletter/"
    else:
        # Kept beside, never renamed back under the target's name: writers are back at work,
        # and one that found the name absent may be about to rename a fresh file there.
        name = target or "recovered.json"
        parked = park(staging_fd, entry, staging_fd, name, how.now)
        how.log.warning("conflict_parked", path=name, kept_as=parked)
        action = f"kept as {parked}"
    fsio.fsync_dir(staging_fd)
    fsio.crash_point("temp-recovered")
    how.log.warning("temp_recovered", path=path, action=action)


def _in_originals(mem_fd: int, sha: str) -> bool:
    """Are these exact bytes in ``deadletter/originals/``? Checked by content, not by name.

    A name there is never trusted (SPEC 4): only a regular file whose bytes hash to ``sha``.
    """
    suffix = f".{sha[:16]}."
    try:
        with fsio.opened_dir(f"{DEADLETTER}/{ORIGINALS_DIR}", mem_fd) as or_fd:
            for name in os.listdir(or_fd):
                if suffix not in name:
                    continue
                try:
                    with safe_open.open_regular(or_fd, name) as (fd, _st):
                        if safe_open.hash_fd(fd)[0] == sha:
                            return True
                except OSError:
                    continue
            return False
    except OSError:
        return False
