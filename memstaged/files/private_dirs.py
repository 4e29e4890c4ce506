"""The directories memstaged keeps its own files in: its state dir, its control socket's.

Each is made 0700 with every parent it makes (:func:`private_dirs`), used only when it is the
user's own and private (:func:`check_private`), as ssh refuses a directory that is not, and
opened through a descriptor checked before use (:func:`open_private_dir`,
:func:`state_subdir`), so that it cannot be swapped between the check and its use. The way to
the state dir is checked too (:func:`check_ancestors`): no other user may be able to make it
lead elsewhere. A refusal is :class:`~memstaged.errors.NotPrivate`, one line.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from memstaged.errors import NotPrivate
from memstaged.files import fsio


def private_dirs(path: Path) -> None:
    """``mkdir -p`` with every directory it creates 0700, parents included (SPEC 6).

    ``Path.mkdir(parents=True, mode=0o700)`` gives the mode to the last one only: the parents
    get the umask's default (0755), and ``$XDG_STATE_HOME/memstaged`` was world-readable.
    Directories that exist already are left as they are: they are not memstaged's.
    """
    missing: list[Path] = []
    here = path
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile by another process


def _owner(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_private(fd: int, path: os.PathLike[str] | str) -> None:
    """Raise :class:`~memstaged.errors.NotPrivate` unless ``fd`` is of a directory that is the
    user's own (the effective uid's) and private (no permission for group or others).

    The user's own directory that group or others may read or enter but not write (0755, as
    versions before 0.2 left ``$XDG_STATE_HOME/memstaged``) is made private (``fchmod`` 0700):
    no one else can have put anything in it. One that others may write is refused.
    """
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not mode & 0o022:
        if mode & 0o077:
            os.fchmod(fd, mode & 0o700)
        return
    why = (
        f"bad ownership or modes for directory {os.fspath(path)} (owner {_owner(st.st_uid)}, "
        f"mode {mode:04o}): it must be {_owner(os.geteuid())}'s own, mode 0700"
    )
    raise NotPrivate(errno.EPERM, why, os.fspath(path))


def open_private_dir(
    path: os.PathLike[str] | str, dir_fd: int | None = None, *, create: bool = True
) -> int:
    """Open the directory memstaged keeps its own files in (its state dir, its control
    socket's), checked to be the user's own and private (:func:`check_private`), through the
    descriptor it returns: it cannot be swapped between the check and its use.

    ``create``: a missing one is made 0700 (its parents too, for a path not relative to
    ``dir_fd``). Its last component is never followed: a link there is refused (NotPrivate).
    Raises :class:`OSError` (``FileNotFoundError`` when missing and not ``create``).
    """
    name = os.fspath(path)
    if create and dir_fd is None:
        private_dirs(Path(name))
    try:
        fd = fsio.open_dir(name, dir_fd, create=create)
    except OSError as err:
        if fsio.is_link(err, dir_fd, name):
            raise NotPrivate(
                errno.EPERM,
                f"bad ownership or modes for directory {name}: a symbolic link, not a "
                "directory of memstaged's own",
                name,
            ) from None
        raise
    try:
        check_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def state_subdir(state_dir: os.PathLike[str] | str, sub: str, *, create: bool) -> Iterator[int]:
    """The descriptor of ``state_dir/sub`` for the block: ``state_dir`` opened by
    :func:`open_private_dir` (again at each use: a link put in its place meanwhile is refused,
    not followed), ``sub`` relative to it without following a link, and checked private too.
    A file of memstaged's state is then read and written relative to it, never by its path.
    Raises :class:`OSError` (``FileNotFoundError`` when missing and not ``create``)."""
    base = open_private_dir(state_dir, create=create)
    try:
        fd = open_private_dir(sub, base, create=create)
    finally:
        os.close(base)
    try:
        yield fd
    finally:
        os.close(fd)


#: Links followed on the way to a directory of memstaged's own, at most (the kernel's own limit).
_MAX_LINKS: Final = 40


def check_ancestors(path: os.PathLike[str] | str) -> str:
    """Raise :class:`~memstaged.errors.NotPrivate` unless no other user can change where
    ``path`` leads: each directory on the way to it, as the path is walked the kernel's way (its
    links followed, a ``..`` taken from where the walk is), is the effective user's or root's
    and writable by no one else unless it is sticky (``/tmp``), and each link on the way is the
    user's or root's, as ssh checks the path to ``authorized_keys``. Another user who may write
    a directory on the way, or who owns a link on it, could make the path lead elsewhere after
    memstaged checked it. The last component is left to :func:`check_private`; components still
    missing are memstaged's to make. Returns where the path leads (:func:`walk_to`)."""
    given = os.fspath(path)
    for kind, where, st in _walk(given):
        if kind == "dir":
            _check_on_the_way(where, given)
        elif kind == "link" and st is not None and st.st_uid not in (0, os.geteuid()):
            raise NotPrivate(
                errno.EPERM,
                f"bad ownership for link {where} on the way to {given} (owner "
                f"{_owner(st.st_uid)}): another user could make it lead elsewhere",
                where,
            )
        elif kind == "end":
            return where
    raise AssertionError("a walk always ends")  # pragma: no cover


def walk_to(path: os.PathLike[str] | str) -> str:
    """Where ``path`` leads, walked as :func:`check_ancestors` walks it (no check made): the
    directory memstaged then uses. Raises :class:`OSError` for a way that leads nowhere."""
    for kind, where, _st in _walk(os.fspath(path)):
        if kind == "end":
            return where
    raise AssertionError("a walk always ends")  # pragma: no cover


def _walk(given: str) -> Iterator[tuple[str, str, os.stat_result | None]]:
    """The way to ``given``, step by step: ("dir", a directory passed through, its stat),
    ("link", a link followed, its lstat), and last ("end", where it leads, None). A missing
    component ends the walk there, the rest made by memstaged; a ``..`` after one, or more than
    :data:`_MAX_LINKS` links, is refused (``ENOENT``, ``ELOOP``) as the kernel refuses it."""
    absolute = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    todo = [p for p in absolute.split("/") if p and p != "."]
    here, links = "/", 0
    yield "dir", here, None
    while todo:
        part = todo.pop(0)
        if part == "..":
            here = os.path.dirname(here)
            continue
        nxt = os.path.join(here, part)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if ".." in todo:
                raise FileNotFoundError(
                    errno.ENOENT, "a missing directory on the way", nxt
                ) from None
            yield "end", os.path.join(nxt, *todo), None
            return
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise NotPrivate(errno.ELOOP, f"too many links on the way to {given}", given)
            yield "link", nxt, st
            target = os.readlink(nxt)
            if target.startswith("/"):
                here = "/"
            todo[:0] = [p for p in target.split("/") if p and p != "."]
            continue
        here = nxt
        if todo:  # the last, the directory itself: check_private's
            yield "dir", here, None
    yield "end", here, None


def _check_on_the_way(here: str, given: str) -> None:
    st = os.stat(here)  # a directory, not a link: the walk resolved it
    writable_by_others = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if st.st_uid not in (0, os.geteuid()) or writable_by_others:
        raise NotPrivate(
            errno.EPERM,
            f"bad ownership or modes for directory {here} above {given} (owner "
            f"{_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}): another user could "
            "replace what is below it",
            here,
        )


def private_dir(path: os.PathLike[str] | str, *, create: bool = True) -> bool:
    """Check the directory at ``path`` as :func:`open_private_dir` does (making it if
    ``create``); whether it exists (``False`` only without ``create``)."""
    try:
        fd = open_private_dir(path, create=create)
    except FileNotFoundError:
        if create:
            raise
        return False
    os.close(fd)
    return True
