"""Step 5 of a transaction: change one staging file, losing no writer's version (SPEC 5).

:func:`replace` puts a repair in place (``RENAME_EXCHANGE``), :func:`remove` takes a quarantined
file away and :func:`move` renames a too-large one into ``deadletter/originals/``; each checks
that what its rename displaced is exactly the version that was decided (inode, size, mtime and
bytes). A writer's newer version caught by the rename is kept as a new staging file under a
``.conflict-`` name (:func:`park`), never put back under its name: while the name held our
rewrite (or nothing), a writer may have renamed its next version there, which putting ours back
would destroy.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import NamedTuple

from memstaged.core.records import stem
from memstaged.files import fsio, temp_names
from memstaged.files.fsio import Identity
from memstaged.files.plan import Status
from memstaged.files.version import Version


class Carried(NamedTuple):
    """What became of a staging file's change."""

    status: Status
    #: The identity of the version now decided: for a repair, the rewrite put in place.
    identity: Identity
    #: The ``.conflict-`` name a displaced writer version got.
    conflict: str | None = None
    #: A repair: ``identity`` is the rewrite's, its bytes read again there through the temp's
    #: descriptor and found to be what memstaged wrote (:func:`replace`'s ``look``).
    looked: bool = False


def park(from_fd: int, tmp: str, staging_fd: int, name: str, now: float) -> str:
    """Keep a displaced writer version as a new staging file, to be decided on its own.

    ``<stem>.conflict-<now>-<n>.json``, created with ``RENAME_NOREPLACE``: never over a file.
    """
    base = temp_names.clip_name(stem(name), 180)
    for attempt in range(100):
        parked = f"{base}.conflict-{int(now)}-{attempt}.json"
        try:
            fsio.rename_noreplace(from_fd, tmp, staging_fd, parked)
        except FileExistsError:
            continue
        fsio.crash_point("parked")
        return parked
    raise OSError(errno.EEXIST, "no free name to keep a displaced version", name)


def _not_in_place(state: bool | None, version: Version) -> Carried:
    return Carried(Status.GONE if state is None else Status.CHANGED, version.identity)


def replace(
    staging_fd: int,
    version: Version,
    tmp: str,
    now: float,
    look: tuple[int, bytes] | None = None,
) -> Carried:
    """Atomically put the durable rewrite ``tmp`` in place of exactly ``version``.

    The exchange hands back whatever it displaced; if that is not ``version`` (a writer renamed
    or rewrote a newer one in between the check and the exchange), it is parked.

    ``look``: the temp's descriptor, readable, and the bytes written to it. The temp's name
    must still hold that descriptor's inode (a file renamed over it is neither put in place nor
    removed: ``CHANGED``). Once the rewrite is in place, the name is looked at (``lstat``, as
    without it) and, if it is still the rewrite's inode, its bytes are read through the
    descriptor: the same bytes make the identity just taken that of memstaged's own rewrite, as
    read (``looked``; SPEC 1's look, for a run that has its file's bytes no other way). A
    writer's write after the ``lstat`` changes the identity (its ctime), so it is decided
    afresh when next seen; one before it changes the bytes read, and nothing is looked.
    """
    name = version.name
    tmp_is_ours = True
    try:
        st = fsio.lstat_at(staging_fd, tmp)
        assert st is not None
        if look is not None:
            held = os.fstat(look[0])
            if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
                # Another process renamed a file over the temp: not ours to install, nor to
                # remove. The version stays; it is decided again.
                tmp_is_ours = False
                return Carried(Status.CHANGED, version.identity)
        rewrite = Identity.of(st)
        state = version.still_in_place(staging_fd)
        if not state:
            return _not_in_place(state, version)
        try:
            fsio.exchange(staging_fd, tmp, name)
        except FileNotFoundError:
            return Carried(Status.GONE, version.identity)
        tmp_is_ours = False
        fsio.crash_point("exchanged")
        if version.is_displaced(staging_fd, tmp):
            os.unlink(tmp, dir_fd=staging_fd)
            fsio.crash_point("replaced")
            now_st = fsio.lstat_at(staging_fd, name)  # the exchange changed the rewrite's ctime
            fsio.crash_point("rewrite-seen")
            looked = False
            if now_st is not None and now_st.st_ino == rewrite.ino:
                rewrite = Identity.of(now_st)
                if look is not None:
                    fd, data = look
                    looked = os.pread(fd, len(data) + 1, 0) == data
            return Carried(Status.DONE, rewrite, looked=looked)
        parked = park(staging_fd, tmp, staging_fd, name, now)
        return Carried(Status.CONFLICT, version.identity, parked)
    finally:
        if tmp_is_ours:
            fsio.unlink_quietly(staging_fd, tmp)


def remove(staging_fd: int, version: Version, now: float) -> Carried:
    """Remove exactly ``version``: renamed away to a temp name and checked there first."""
    name = version.name
    state = version.still_in_place(staging_fd)
    if not state:
        return _not_in_place(state, version)
    out = temp_names.temp_name("out", name)
    try:
        os.rename(name, out, src_dir_fd=staging_fd, dst_dir_fd=staging_fd)
    except FileNotFoundError:
        return Carried(Status.GONE, version.identity)
    fsio.crash_point("renamed-away")
    if version.is_displaced(staging_fd, out):
        os.unlink(out, dir_fd=staging_fd)
        fsio.crash_point("removed")
        return Carried(Status.DONE, version.identity)
    parked = park(staging_fd, out, staging_fd, name, now)
    return Carried(Status.CONFLICT, version.identity, parked)


def move(
    staging_fd: int,
    dl_fd: int,
    or_fd: int,
    version: Version,
    original: str,
    records: Sequence[str],
    now: float,
) -> Carried:
    """Move a too-large file itself to ``originals/<original>`` by a rename (SPEC 6).

    No copy, no read: its ``records`` are durable already. If what the rename moved is not
    ``version`` (a writer renamed a new one in meanwhile), that version goes back to
    ``staging/`` under a ``.conflict-`` name, and the records are taken back.
    """
    name = version.name
    state = version.still_in_place(staging_fd)
    if state:
        try:
            fsio.rename_noreplace(staging_fd, name, or_fd, original)
        except FileNotFoundError:
            state = None
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            _take_back(dl_fd, records)
            return Carried(Status.UNMOVABLE, version.identity)
    if not state:
        _take_back(dl_fd, records)
        return _not_in_place(state, version)
    fsio.crash_point("moved")
    fsio.fsync_dir(or_fd)
    if version.is_displaced(or_fd, original):
        return Carried(Status.DONE, version.identity)
    parked = park(or_fd, original, staging_fd, name, now)
    _take_back(dl_fd, records)
    return Carried(Status.CONFLICT, version.identity, parked)


def _take_back(dl_fd: int, records: Sequence[str]) -> None:
    """Delete the records just written for a version that was not quarantined after all."""
    for record in records:
        fsio.unlink_quietly(dl_fd, record)
    fsio.fsync_dir(dl_fd)
