"""Files an operator's command depends on or removes, checked as they were read (SPEC 5).

``deadletter recover``, ``purge`` and ``drop_originals`` plan from a listing made without the
lock; under it, :mod:`memstaged.files.transaction` uses these to check that each file is still the
very file that was read (:func:`is_held`), to make a staging file a removal depends on durable
(:func:`made_durable`), to remove a file only if it still is (:func:`unlink_held`), and to
find a free name for a new staging file (:func:`free_name`).
"""

from __future__ import annotations

import os
from typing import Final

from memstaged.files import fsio, safe_open
from memstaged.files.fsio import Identity
from memstaged.files.memdir import DEADLETTER
from memstaged.files.plan import Held

#: How many names ``<base>.recovered-<n>.json`` a new staging file may try.
_CREATE_NAMES: Final = 100_000


def recovered_name(base: str, n: int) -> str:
    """The ``n``-th name of a staging file recovered from the records of session ``base``."""
    return f"{base}.recovered-{n}.json"


def free_name(staging_fd: int, base: str, taken: set[str]) -> str | None:
    """The first :func:`recovered_name` that names nothing in ``staging/``."""
    for n in range(1, _CREATE_NAMES):
        name = recovered_name(base, n)
        if name not in taken and fsio.lstat_at(staging_fd, name) is None:
            return name
    return None


def is_held(dir_fd: int, held: Held) -> str | None:
    """``None`` when ``held`` is still the file that was read, else ``gone`` or ``changed``."""
    st = fsio.lstat_at(dir_fd, held.name)
    if st is None:
        return "gone"
    if held.identity is not None and Identity.of(st) != held.identity:
        return "changed"
    return None


def made_durable(staging_fd: int, held: Held) -> str | None:
    """fsync a staging file a change depends on (``staging/`` follows); why not, else ``None``."""
    try:
        with safe_open.open_regular(staging_fd, held.name) as (fd, st):
            if held.identity is not None and Identity.of(st) != held.identity:
                return "changed"
            os.fsync(fd)
    except FileNotFoundError:
        return "gone"
    except OSError:
        return "changed"  # no longer a regular file we can read
    return None


def unlink_held(dir_fd: int, held: Held) -> tuple[bool, str | None]:
    """Remove ``held`` if it is still the file that was read: (removed, why it is left).

    One already gone is what was wanted (not removed, not left). One changed meanwhile
    (quarantined again, edited) is someone's newer file: it stays.
    """
    why = is_held(dir_fd, held)
    if why == "gone":
        return False, None
    if why == "changed":
        what = "record" if held.where == DEADLETTER else "file"
        return False, f"the {what} changed while this ran; it is left in place"
    try:
        os.unlink(held.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False, None
    except OSError as err:
        return False, f"cannot delete it: {err.strerror or err}"
    fsio.crash_point("unlinked")
    return True, None
