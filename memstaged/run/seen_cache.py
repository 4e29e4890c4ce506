"""The seen cache: staging files decided ``valid`` or ``foreign`` and not changed since.

A repeated ``--once`` (and the daemon's start-up scan) need not read such a file again: one
``lstat`` tells that it is the same version — same device, inode, size, mtime and ctime (any
write, rename or ``chmod`` changes the ctime). The cache lives under
``$XDG_STATE_HOME/memstaged/seen/``, one file per memory dir. It is only a cache: a missing,
corrupt or outdated one costs a re-read, never a wrong decision, and it is dropped whole when the
engine differs from the run that wrote it. No setting changes a ``valid`` or ``foreign``
decision except the size limit, which drops the entries of files over it.

``--once`` and the daemon share the file of a memory dir: they never work on one memory dir at the
same time (the instance lock), so neither sees the other's half-written state, and whatever one
decided the other need not decide again. ``--once`` loads it before deciding and saves it after;
the daemon loads it when it adds a memory dir (so a restart does not re-read, nor log anew, what
it decided before), keeps it up to date as it decides, and saves it at each periodic rescan, on
SIGHUP, when it drops a memory dir and when it stops (one write per decision would cost more
than the re-reads it saves). A dry run never writes it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from memstaged.core import digests
from memstaged.core.decide import Decision
from memstaged.files import atomic_write, fsio, private_dirs, safe_open

if TYPE_CHECKING:
    from memstaged.config import Settings
    from memstaged.files.memdir import MemoryDir, Options
    from memstaged.run.decision import Outcome

#: Where every verdict comes from: the package and the module of ``decide``. The fingerprint
#: covers them and every memstaged module they import, directly or not (:func:`engine_files`).
_DECISION_ROOTS: Final = ("__init__.py", "core/decide.py")
#: An import of a memstaged module: ``from memstaged[.a.b] import x, (y, z)``, ``from .a import``,
#: ``from . import x``, ``import memstaged.a``, anywhere in a line's indentation (imports made
#: inside a function count too). Group 1: the module after ``memstaged.`` or ``.`` (or empty);
#: group 2: the names imported (each may be a module); group 3: ``import memstaged.a``'s module.
_IMPORT: Final = re.compile(
    rb"^[ \t]*(?:from[ \t]+(?:memstaged|\.)(?:\.?([\w.]+))?[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)"
    rb"|import[ \t]+memstaged\.([\w.]+))",
    re.MULTILINE,
)
_WORD: Final = re.compile(rb"\w+")
#: A source of the package larger than this is not one (the largest is about 30 KB).
_MAX_SOURCE: Final = 16 * 1024 * 1024

Key = tuple[int, int, int, int, int]

#: Decisions that leave a file as it is in staging/: worth remembering. A repaired file's
#: rewrite is remembered once memstaged looked at it and found it valid (SPEC 1).
STAYS: Final = frozenset({Decision.VALID, Decision.FOREIGN})
#: A cache file larger than this is not one memstaged wrote (a million entries take ~100 MB).
_MAX_SIZE: Final = 512 * 1024 * 1024
#: The caches' directory in the state dir.
SEEN_DIR: Final = "seen"


class _CacheFile(msgspec.Struct, frozen=True):
    fingerprint: str
    entries: dict[str, tuple[Key, str]]
    #: Names that are not UTF-8 (SPEC 6: any name), by their bytes: msgpack strings must be
    #: UTF-8, and ``os.fsdecode`` gives such a name as a string with lone surrogates.
    raw_entries: dict[bytes, tuple[Key, str]] = {}


_decoder: Final = msgspec.msgpack.Decoder(_CacheFile)
_engine_digest: str | None = None


def engine_files(package: str) -> list[str]:
    """The source files of the decision, relative to ``package`` (the package's directory):
    :data:`_DECISION_ROOTS` and every module of the package they import, transitively, sorted.

    Found by following the imports written in the sources, not by a list kept by hand: a module
    the decision comes to use is covered as soon as it is imported, and an edit of any of them
    (``Date.parse``'s included) drops every cache of ``valid`` decisions made by the old code.
    A regular expression over the bytes, not :mod:`ast`, and one listing per directory, not a
    ``stat`` per name: about 2 ms for the dozen files, where parsing them costs tens of
    milliseconds of every start-up that loads a cache. It may find more than is imported (an
    import in a docstring), never less, for the forms above.
    """
    listings: dict[str, frozenset[str]] = {}

    def exists(relative: str) -> bool:
        folder, _, name = relative.rpartition("/")
        if folder not in listings:
            try:
                listings[folder] = frozenset(os.listdir(os.path.join(package, folder)))
            except OSError:
                listings[folder] = frozenset()
        return name in listings[folder]

    found: set[str] = set()
    todo = list(_DECISION_ROOTS)
    while todo:
        relative = todo.pop()
        if relative in found or not exists(relative):
            continue
        found.add(relative)
        text = safe_open.read_small(os.path.join(package, relative), _MAX_SOURCE)
        for match in _IMPORT.finditer(text):
            module, names, imported = match.groups()
            todo.extend(_module_files((module or imported or b"").decode(), names))
    return sorted(found)


def _module_files(base: str, names: bytes | None) -> list[str]:
    """The files an import may run, relative to the package: the module ``base`` (with the
    ``__init__.py`` of each package on the way), and each imported name that is a module."""
    parts = [p for p in base.split(".") if p]
    out = ["/".join([*parts[:i], "__init__.py"]) for i in range(len(parts))]
    if parts:
        out += ["/".join(parts) + ".py", "/".join([*parts, "__init__.py"])]
    prefix = "".join(f"{p}/" for p in parts)
    for word in _WORD.findall(names or b""):
        name = word.decode()
        out += [f"{prefix}{name}.py", f"{prefix}{name}/__init__.py"]
    return out


def _engine_hash() -> str:
    """What the engine is: the bytes of every file of :func:`engine_files`, by name (not the
    version: a build that changes other code keeps the cache). Computed once per process, on
    first use."""
    global _engine_digest  # noqa: PLW0603 - computed once per process, on first use
    if _engine_digest is None:
        digest = digests.sha256()
        package = os.path.dirname(os.path.dirname(__file__))
        for relative in engine_files(package):
            digest.update(b"\0" + os.fsencode(relative) + b"\0")
            digest.update(safe_open.read_small(os.path.join(package, relative), _MAX_SOURCE))
        _engine_digest = digest.hexdigest()[:16]
    return _engine_digest


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while tens of thousands of acyclic objects (cache entries, stat
    results) are made: a collection in between would walk the whole heap and free nothing. Worth
    ~0.3 µs of the ~4.5 µs an unchanged file costs (docs/performance.md)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SeenCache:
    """Name -> (identity, decision) of one memory dir's files that stayed as they were decided."""

    def __init__(self, path: Path | None, fingerprint: str) -> None:
        #: ``state_dir/seen/<hash>.msgpack``; opened relative to the checked descriptor of
        #: ``seen/`` (:func:`memstaged.files.private_dirs.state_subdir`), never by this path.
        self.path = path
        self.fingerprint = fingerprint
        self.entries: dict[str, tuple[Key, str]] = {}
        self.dirty = False

    @classmethod
    def load(
        cls, state_dir: Path | None, memory_dir: str, project_root: str, settings_key: str
    ) -> SeenCache:
        """The cache of ``memory_dir``, empty when there is none or it does not apply."""
        fingerprint = f"{_engine_hash()}|{project_root}|{settings_key}"
        if state_dir is None:
            return cls(None, fingerprint)
        name = digests.sha256(os.fsencode(memory_dir)).hexdigest()[:24] + ".msgpack"
        cache = cls(state_dir / SEEN_DIR / name, fingerprint)
        try:
            with private_dirs.state_subdir(state_dir, SEEN_DIR, create=False) as fd:
                raw = safe_open.read_private(name, _MAX_SIZE, dir_fd=fd)
            with _gc_paused():
                stored = _decoder.decode(raw)
        except (OSError, msgspec.DecodeError):
            return cache  # none yet, or unreadable: start afresh
        if stored.fingerprint == fingerprint:
            cache.entries = dict(stored.entries)
            for raw_name, entry in stored.raw_entries.items():
                cache.entries[os.fsdecode(raw_name)] = entry
        return cache

    def split(self, staging_fd: int, names: list[str]) -> tuple[list[str], list[str]]:
        """The files to read (new or changed since decided), and the decisions the others hold.

        This loop is the whole cost of a rescan of decided files (the steady state): one
        ``lstat`` relative to the open ``staging/`` per cached file and a comparison with its
        stored identity, field by field, without building a key per file.
        """
        with _gc_paused():
            return self._split(staging_fd, names)

    def _split(self, staging_fd: int, names: list[str]) -> tuple[list[str], list[str]]:
        entries = self.entries
        lstat = os.stat
        todo: list[str] = []
        held: list[str] = []
        for name in names:
            entry = entries.get(name)
            if entry is not None:
                try:
                    st = lstat(name, dir_fd=staging_fd, follow_symlinks=False)
                except OSError:
                    todo.append(name)  # gone or unreadable: process() says what it is
                    continue
                dev, ino, size, mtime_ns, ctime_ns = entry[0]
                if (
                    st.st_ino == ino
                    and st.st_mtime_ns == mtime_ns
                    and st.st_ctime_ns == ctime_ns
                    and st.st_size == size
                    and st.st_dev == dev
                ):
                    held.append(entry[1])
                    continue
            todo.append(name)
        return todo, held

    def remember(self, name: str, key: Key, decision: str) -> None:
        self.entries[name] = (key, decision)
        self.dirty = True

    def forget(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self.dirty = True

    def limit(self, max_file_size: int) -> None:
        """Drop files larger than the size limit: under it, they are no longer decided as they
        were (SPEC 6: too large to read), and must be decided again."""
        for name in [n for n, (key, _d) in self.entries.items() if key[2] > max_file_size]:
            del self.entries[name]
            self.dirty = True

    def keep_only(self, names: set[str]) -> None:
        """Drop files that are gone from ``staging/``."""
        for name in [n for n in self.entries if n not in names]:
            del self.entries[name]
            self.dirty = True

    def save(self) -> None:
        """Write the cache (temp file and rename: a reader never sees half of it), 0600 from
        its creation (SPEC 6). Best effort: a cache that cannot be written only means files are
        read again next time. Not fsynced: a cache cut short by a crash fails to decode and is
        started afresh."""
        if self.path is None or not self.dirty:
            return
        data = _encode(self.fingerprint, self.entries)
        try:
            with private_dirs.state_subdir(self.path.parent.parent, SEEN_DIR, create=True) as fd:
                atomic_write.replace_at(fd, self.path.name, data, sync=False)
        except OSError:
            return
        self.dirty = False


def _encode(fingerprint: str, entries: dict[str, tuple[Key, str]]) -> bytes:
    """The cache's bytes; names that are not UTF-8 go by their bytes, losslessly."""
    try:
        return msgspec.msgpack.encode(_CacheFile(fingerprint, entries))
    except UnicodeEncodeError:
        pass  # some name holds a byte that is not UTF-8: rare, so only then split them off
    plain: dict[str, tuple[Key, str]] = {}
    raw: dict[bytes, tuple[Key, str]] = {}
    for name, entry in entries.items():
        try:
            name.encode()
        except UnicodeEncodeError:
            raw[os.fsencode(name)] = entry
        else:
            plain[name] = entry
    return msgspec.msgpack.encode(_CacheFile(fingerprint, plain, raw))


def settings_key(options: Options) -> str:
    """The settings that change a ``valid`` or ``foreign`` decision, and so what the cache holds:
    none. ``split_invalid_candidates`` changes only what becomes of an invalid file, and such a
    file is never cached: a change of it keeps the cache (a restart after it
    logged again ten files whose bytes were already decided). The size limit makes a file too
    large to be valid: it is applied to the entries (:meth:`SeenCache.limit`), not to the whole.
    """
    del options
    return "v2"


def seen_cache(settings: Settings, mdir: MemoryDir) -> SeenCache:
    """The cache of ``mdir`` as ``--once`` and the daemon use it (empty when it does not apply)."""
    cache = SeenCache.load(
        settings.state_dir, mdir.path, mdir.project_root, settings_key(settings.options)
    )
    cache.limit(settings.options.max_file_size)
    return cache


def remember_outcome(cache: SeenCache, mdir: MemoryDir, name: str, outcome: Outcome) -> None:
    """Cache a file that stays as it was decided, under the identity of the version decided;
    forget any other (quarantined, repaired, skipped, gone, or changed while being decided). A
    repair whose rewrite was looked at in place is its rewrite, decided ``valid``."""
    decision = Decision.VALID if outcome.looked else outcome.decision
    if decision in STAYS and outcome.identity is not None:
        # The identity read and decided, not a new lstat (one call less per file): a
        # writer that replaced the file since is noticed by the next split's lstat anyway.
        ident = outcome.identity
        key = (ident.dev, ident.ino, ident.size, ident.mtime_ns, ident.ctime_ns)
        cache.remember(name, key, decision.value)
        return
    cache.forget(name)


def split_unchanged(
    cache: SeenCache, staging: str, names: list[str]
) -> tuple[list[str], list[str]]:
    """:meth:`SeenCache.split` on ``staging`` opened without following a link (a ``staging/``
    replaced by a link is not looked into: every name is then left to the pipeline)."""
    if not cache.entries:
        return names, []
    try:
        staging_fd = fsio.open_dir(staging)
    except OSError:
        return names, []  # pipeline.process says why, file by file
    try:
        return cache.split(staging_fd, names)
    finally:
        os.close(staging_fd)
