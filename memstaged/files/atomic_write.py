"""The one way memstaged writes a file: complete before it has its name (SPEC 5 and 6).

Every file memstaged writes (temps, dead-letter copies, the writer lock, the seen cache, the ack
marks, the metrics file, a unit, a completion script) goes through :func:`put_complete`: mode
0600 from its creation (never the umask's, never a later ``chmod``), its bytes written and
fsynced before the name exists, and the name given by a link of an unnamed ``O_TMPFILE`` inode
or a rename that never replaces (unless replacing is what is asked). A reader, or a memstaged
starting after a crash, sees the old file or the new one whole, never a part. What the temp
files are called is :mod:`memstaged.files.temp_names`'s.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from typing import TypeVar

from memstaged.core import digests
from memstaged.files import fsio
from memstaged.files.temp_names import PARTIAL, temp_name


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unnamed(dir_fd: int, access: int) -> int | None:
    """An unnamed file in ``dir_fd`` (``O_TMPFILE``), or None where the file system has none."""
    try:
        return os.open(".", access | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


_T = TypeVar("_T")


def _create_private(dir_fd: int, name: str, mode: int = 0o600, access: int = os.O_WRONLY) -> int:
    """A new file ``name`` in ``dir_fd``: 0600 from its creation (then ``mode`` exactly, not
    the umask's, for a file others are to read), never through a link, never one that is
    already there."""
    fd = os.open(
        name,
        access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    if mode != 0o600:
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
    return fd


def put_complete(
    dir_fd: int,
    name: str,
    fill: Callable[[int], _T],
    *,
    partial: str | None,
    unnamed: bool = True,
    replace: bool = False,
    sync: bool = True,
    created: str = "",
    complete: str = "",
    mode: int = 0o600,
    keep: list[int] | None = None,
) -> _T:
    """Put a file under ``name`` in ``dir_fd`` only once ``fill`` has written all of it.

    The one way memstaged writes a file of its own (temps, dead-letter copies, the writer lock,
    the seen cache): mode 0600 from creation (never the umask's, never a later ``chmod``), the
    bytes written by ``fill(fd)`` and fsynced (unless ``sync`` is false) before the name
    exists. With ``unnamed``, the bytes go to an ``O_TMPFILE`` inode that is linked under
    ``name`` (``FileExistsError`` if it is taken); without one (or with ``replace``, which a
    link cannot do, or without ``/proc``, through which the link is made), they go to the temp
    file ``partial``, renamed onto ``name`` (replacing it
    with ``replace``, else ``RENAME_NOREPLACE``). With ``partial`` None the file is created
    under ``name`` itself, and removed again if ``fill`` fails. ``created`` and ``complete``
    name the crash points after the file is opened and after its bytes are durable. ``mode``:
    the file's mode, 0600 unless others are to read it (a unit, a completion script).
    ``keep``: the file is opened for reading too, and its descriptor, left open once it has its
    name, is appended to ``keep`` for the caller to close.
    """
    access = os.O_WRONLY if keep is None else os.O_RDWR
    # An unnamed inode is linked through /proc/self/fd: without /proc, a named partial temp
    unnamed = unnamed and not replace and mode == 0o600 and fsio.proc_fd_linkable()
    fd = _unnamed(dir_fd, access) if unnamed else None
    part = None
    if fd is None:
        part = name if partial is None else partial
        fd = _create_private(dir_fd, part, mode, access)
    try:
        if created:
            fsio.crash_point(created)
        result = fill(fd)
        if sync:
            os.fsync(fd)
        if complete:
            fsio.crash_point(complete)
        if part is None:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd)
        elif part != name:
            if replace:
                os.rename(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                fsio.rename_noreplace(dir_fd, part, dir_fd, name)
    except BaseException:
        os.close(fd)
        if part is not None:
            fsio.unlink_quietly(dir_fd, part)  # never ``name`` once renamed: that failed, or raised
        raise
    if keep is None:
        os.close(fd)
    else:
        keep.append(fd)
    return result


def replace_file(
    path: os.PathLike[str] | str,
    data: bytes,
    *,
    sync: bool = True,
    mode: int = 0o600,
    parents: bool = False,
) -> None:
    """Replace ``path`` (a file the user named or installs: the metrics file, a unit, a
    completion script) with ``data`` as :func:`replace_at` does, with ``mode``. The directory is
    opened without following a link in its last component; with ``parents``, missing ones are
    made first (0755: what is installed there is for others too). Raises :class:`OSError`."""
    parent, name = os.path.split(os.fspath(path))
    if parents and parent:
        os.makedirs(parent, 0o755, exist_ok=True)
    dir_fd = fsio.open_dir(parent or ".")
    try:
        replace_at(dir_fd, name, data, sync=sync, mode=mode)
    finally:
        os.close(dir_fd)


def replace_at(
    dir_fd: int, name: str, data: bytes, *, sync: bool = True, mode: int = 0o600
) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` through :func:`put_complete`: ``mode``
    (0600) from creation, a reader sees the old file or the new one whole. Raises
    :class:`OSError`."""
    tmp = f".{name}.{os.getpid()}.tmp"
    fsio.unlink_quietly(dir_fd, tmp)  # a crashed run's, under the same pid: O_EXCL would refuse
    put_complete(
        dir_fd,
        name,
        lambda fd: write_all(fd, data),
        partial=tmp,
        replace=True,
        sync=sync,
        mode=mode,
    )


def write_temp(
    dir_fd: int,
    data: bytes,
    role: str,
    for_name: str = "",
    *,
    sync: bool = True,
    deleted_whole_or_partial: bool = False,
    keep: list[int] | None = None,
) -> str:
    """Write ``data`` to a new temp file in ``dir_fd`` (0600), fsynced unless told otherwise.

    The temp file gets its name only once it is complete: the bytes go to an unnamed
    ``O_TMPFILE`` inode, linked under the name when written. A crash therefore never leaves a
    partial temp that recovery could not tell from a writer's version displaced by an exchange.
    (Without ``O_TMPFILE``, a :data:`PARTIAL` temp is renamed; recovery deletes those.)

    ``deleted_whole_or_partial``: crash recovery deletes this temp however much of it was
    written (every temp in ``deadletter/``; a :data:`PARTIAL` one in ``staging/``), so it is
    created under its name at once, ``O_EXCL``: no unnamed inode, no link.

    ``keep``: the temp's descriptor, readable, is appended to it and left open (see
    :func:`put_complete`).
    """
    return _write_temp(
        dir_fd,
        data,
        role,
        for_name,
        sync=sync,
        hold=False,
        named=deleted_whole_or_partial,
        keep=keep,
    )[0]


def write_held_temp(
    dir_fd: int, data: bytes, role: str, for_name: str = "", *, sync: bool = True
) -> tuple[str, int]:
    """:func:`write_temp`, and a descriptor of the temp holding an exclusive ``flock`` on it,
    taken before it has its name; the caller closes it once the temp is renamed or removed.

    For a temp written by a process that works beside the daemon (``deadletter recover``): a
    memstaged starting meanwhile must not take it for a killed process's leftover and delete it
    (:func:`~memstaged.files.fsio.temp_in_use`). The kernel drops the lock when the process
    dies, so a killed writer's temps are still cleaned up.
    """
    return _write_temp(dir_fd, data, role, for_name, sync=sync, hold=True, named=False)


def _write_temp(
    dir_fd: int,
    data: bytes,
    role: str,
    for_name: str,
    *,
    sync: bool,
    hold: bool,
    named: bool,
    keep: list[int] | None = None,
) -> tuple[str, int]:
    name = temp_name(role, for_name)
    held: list[int] = []

    def fill(fd: int) -> None:
        if hold:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new inode: no one else has it
            held.append(os.dup(fd))  # the same open file, so the same lock, kept past close
        write_all(fd, data)

    try:
        put_complete(
            dir_fd,
            name,
            fill,
            partial=None if named else temp_name(PARTIAL, for_name),
            unnamed=not named,
            sync=sync,
            created="temp-created",
            keep=keep,
        )
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return name, held[0] if held else -1


def copy_to_temp(
    src_fd: int, dir_fd: int, role: str, for_name: str = "", *, most: int | None = None
) -> tuple[str, str, int]:
    """Copy a file in bounded chunks to a fsynced temp file; returns name, sha256 and size.

    With ``most``, no more than that many bytes are copied (a growing file is not chased):
    raises ``OSError(EFBIG)`` if there is more.
    """
    name = temp_name(role, for_name)

    def copy(fd: int) -> tuple[str, int]:
        digest = digests.sha256()
        size = 0
        while chunk := os.pread(
            src_fd, fsio.CHUNK if most is None else min(fsio.CHUNK, most - size + 1), size
        ):
            if most is not None and size + len(chunk) > most:
                raise OSError(errno.EFBIG, "larger than it was when it was decided", for_name)
            digest.update(chunk)
            size += len(chunk)
            write_all(fd, chunk)
        return digest.hexdigest(), size

    sha256, size = put_complete(dir_fd, name, copy, partial=None, unnamed=False)
    return name, sha256, size
