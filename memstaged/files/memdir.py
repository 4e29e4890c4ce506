"""A memory dir, and the settings that change how its files are decided (SPEC sections 1, 5, 6)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import msgspec

from memstaged.files import fsio

if TYPE_CHECKING:
    from memstaged.core.decide import Context

STAGING: Final = "staging"
DEADLETTER: Final = "deadletter"


class MemoryDir(msgspec.Struct, frozen=True):
    """A memory dir and the project root its files must name (SPEC 2.4).

    ``project_root`` is the root's physical path (:func:`physical_path`), which is the root the
    reconciler has; ``named_root`` the root as configured or derived from ``path`` (three levels
    up), when links make the two differ (empty when they do not).

    ``anchor`` is the configured literal prefix it was found under (the part of a glob before
    its first wildcard, or the directory a memory dir was derived from): links are followed
    only there, never below it (SPEC 6). Empty: the memory dir's parent.
    """

    path: str
    project_root: str
    anchor: str = ""
    named_root: str = ""

    def physical_root_said(self) -> dict[str, str] | None:
        """SPEC 2.4: when this memory dir's path, or its project root's, holds a symbolic link,
        the fields of the event that says which physical root its files are compared with
        (said once, at start); None when there is no link to say."""
        if not self.named_root and physical_path(self.path) == self.path:
            return None
        said = {"memory_dir": self.path, "project_root": self.project_root}
        if self.named_root:
            said["named_root"] = self.named_root
        return said

    @property
    def staging(self) -> str:
        return os.path.join(self.path, STAGING)

    def context(self, name: str, options: Options, *, settled: bool, decided_at: str) -> Context:
        """What ``staging/<name>`` is decided in, by the daemon, ``--once`` and every preview
        alike (``status``, ``check``): its project root, name and path, and the options."""
        from memstaged.core.decide import Context  # the engine, for those that decide

        return Context(
            project_root=self.project_root,
            file_name=name,
            source_path=os.path.join(self.staging, name),
            settled=settled,
            split_invalid_candidates=options.split_invalid_candidates,
            decided_at=decided_at,
        )

    def open(self) -> int:
        """The memory dir's descriptor, opened without following a link below the anchor."""
        return fsio.open_below(self.anchor, self.path)

    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the directory itself, opened as its instance lock opens it.

        Two paths to one memory dir (a bind mount of the project, a linked literal prefix) have
        the same identity, and must not be decided twice with two project roots. None when it cannot
        be opened (gone, a link below the anchor): whoever opens it next says why.
        """
        try:
            fd = self.open()
        except (OSError, ValueError):  # ValueError: a NUL in the path
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return (st.st_dev, st.st_ino)


def physical_path(path: str) -> str:
    """``path`` with every symbolic link resolved, as far as it exists (the rest as written):
    a directory as the reconciler's Node reports it when it works there (``process.cwd()``).
    Touches the disk: used where memory dirs are set up, never in the decision."""
    try:
        return os.path.realpath(path)
    except ValueError:  # a NUL in the path: no such directory, nothing to resolve
        return path


class Options(msgspec.Struct, frozen=True):
    """The settings that change how a file is decided or applied."""

    settle: float = 2.0
    max_file_size: int = 8 * 1024 * 1024
    split_invalid_candidates: bool = False
    dry_run: bool = False
    #: SPEC 6: where a too-large file cannot be moved by a rename, at most this much is copied.
    max_quarantine_copy: int = 1 << 30


def is_staging_name(name: str) -> bool:
    """SPEC section 6: only ``*.json`` names that do not start with a dot are staging files."""
    return name.endswith(".json") and not name.startswith(".")


def staging_names(listing: Iterable[str], *, sort: bool = True) -> list[str]:
    """The staging-file names of a listing of ``staging/``, sorted unless ``sort`` is false."""
    # is_staging_name, inlined: this runs over every name at every rescan.
    names = [n for n in listing if n.endswith(".json") and n[:1] != "."]
    if sort:
        names.sort()
    return names


class opened_memory_dir:  # noqa: N801 - used as a context manager, like open()
    """The memory dir and its ``staging/``, opened without following links (SPEC 6)."""

    def __init__(self, mdir: MemoryDir) -> None:
        self.mdir = mdir
        self.fds: tuple[int, int] | None = None

    def __enter__(self) -> tuple[int, int]:
        mem_fd = self.mdir.open()
        try:
            self.fds = (mem_fd, fsio.open_dir(STAGING, mem_fd))
        except OSError:
            os.close(mem_fd)
            raise
        return self.fds

    def __exit__(self, *_: object) -> None:
        for fd in reversed(self.fds or ()):
            os.close(fd)
