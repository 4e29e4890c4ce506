"""memstaged's own files on this machine: what ``service uninstall`` lists, ``--purge`` removes.

Its config and state directories, the decision log and the metrics file where they are
configured outside the state dir, the shell completions and the man page, and the control
sockets of daemons that are gone. Never anything in a memory dir: its contents, its
``deadletter/`` included, are the writers' data and the only copy of what was quarantined. A
tree with a memory dir inside is kept (a configured one, or any ``staging/`` or ``deadletter/``
directory), a metrics file only while it is a regular file, a socket only while no process
listens on it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Final, NamedTuple

from memstaged import config
from memstaged.errors import ConfigError
from memstaged.files import fsio


class Own(NamedTuple):
    """One of memstaged's own files or directories, as ``uninstall`` finds it."""

    what: str
    path: Path
    #: How ``--purge`` removes it: a ``tree`` (unless a memory dir is inside), a regular
    #: ``file`` only, or a ``socket`` only while no process listens on it.
    kind: str = "tree"


#: What a control socket no daemon listens on is, in uninstall's list.
STALE_SOCKET: Final = "control socket of a daemon that is gone"


def own_files(env: Mapping[str, str]) -> list[Own]:
    """memstaged's own config and state, the decision log and the metrics file where they
    are configured outside the state dir, the completions, and the control sockets no daemon
    listens on any more, those that exist.

    The metrics file is listed only as a regular file (memstaged writes it by a rename), never
    a link or anything else at its path; a control socket only while no process listens on it
    (a daemon killed by the watchdog or SIGKILL leaves its own behind)."""
    from memstaged.cli.commands.completion import targets
    from memstaged.daemon.control_socket import left_sockets
    from memstaged.log.reader import rotated_files

    state = config.default_state_dir(env)
    found = [
        Own("config", config.default_config_path(env).parent),
        Own("state (the decision log, the seen cache)", state),
    ]
    try:
        settings: config.Settings | None = config.load(env=env)
    except ConfigError:
        settings = None
    log_file = None if settings is None else settings.log_file
    if log_file is not None and not log_file.is_relative_to(state):
        found.append(Own("decision log", log_file, "file"))
        with contextlib.suppress(ConfigError):  # a log dir that cannot be listed: none found
            # NAME.1 .. NAME.N, each only while it is a regular file (rotation makes no other)
            found += [Own("decision log", p, "file") for p in rotated_files(log_file)]
    found += [
        Own(f"{t.what} completion" if t.what != "man" else "man page", t.path) for t in targets(env)
    ]
    found = [own for own in found if _there(own)]
    metrics = None if settings is None else settings.metrics_file
    if metrics is not None and not metrics.is_relative_to(state) and _regular(metrics):
        found.append(Own("metrics file", metrics, "file"))
    found += [Own(STALE_SOCKET, path, "socket") for path in left_sockets(env)[0]]
    return found


def _there(own: Own) -> bool:
    """Whether ``own`` is there to list: a ``file`` only as a regular file (a link or a
    directory at a decision log's name is not memstaged's), anything else if it exists."""
    if own.kind == "file":
        return _regular(own.path)
    return own.path.exists() or own.path.is_symlink()


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def memory_dirs(env: Mapping[str, str]) -> tuple[list[Path], str | None]:
    """The configured memory dirs (globs expanded now), or why they cannot be known."""
    try:
        return [Path(m.path) for m in config.load(env=env).memory_dirs()], None
    except ConfigError as err:
        return [], str(err)


def _remove(own: Own, keep: list[Path]) -> str | None:
    """Remove one of memstaged's own (:class:`Own`); None once it is gone, else why it stays:
    a tree with one of ``keep`` (the memory dirs) inside, a metrics file that is no longer a
    regular file, a socket a daemon listens on now."""
    from memstaged.daemon.control_socket import remove_unheard

    if own.kind == "socket":
        return None if remove_unheard(own.path) else "a daemon listens on it now"
    if own.kind == "file":
        return None if fsio.remove_regular(own.path) else "no longer a regular file"
    is_tree = own.path.is_dir() and not own.path.is_symlink()
    if is_tree and any(k == own.path or k.is_relative_to(own.path) for k in keep):
        return "a memory dir is inside"
    if is_tree and (why := _holds_memory_data(own.path)) is not None:
        return why
    fsio.remove(own.path, tree=True)
    return None


#: The directories a memory dir has: a tree holding one is never removed.
_MEMORY_DIR_PARTS: Final = frozenset({"staging", "deadletter"})
#: How many directories of a tree are looked at before it is kept as too large to be sure of.
TREE_LOOK_LIMIT: Final = 10_000
#: How deep a tree is looked into before it is kept as too deep to be sure of (and to remove).
TREE_DEPTH_LIMIT: Final = 100


def _holds_memory_data(tree: Path) -> str | None:
    """Why ``tree`` is kept though no configured memory dir is in it: it has a ``staging/`` or
    ``deadletter/`` directory (the config may not list every memory dir: a file the strict
    loader refuses, a glob that matches nothing today), it has more directories than
    :data:`TREE_LOOK_LIMIT` or more levels than :data:`TREE_DEPTH_LIMIT`, or a directory of it
    cannot be listed. No link is followed; the
    walk keeps its own stack (a tree of any depth is no recursion)."""
    pending = [(tree, 0)]
    looked = 0
    while pending:
        here, depth = pending.pop()
        if depth > TREE_DEPTH_LIMIT:
            return f"deeper than {TREE_DEPTH_LIMIT} levels, not all looked at"
        try:
            with os.scandir(here) as entries:
                dirs = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError as err:
            return f"{here} cannot be listed: {err.strerror}"
        for found in dirs:
            if found.name in _MEMORY_DIR_PARTS:
                return f"{found} may be a memory dir's"
        looked += len(dirs)
        if looked > TREE_LOOK_LIMIT:
            return f"more than {TREE_LOOK_LIMIT} directories inside, not all looked at"
        pending += [(d, depth + 1) for d in dirs]
    return None


def purge(
    own: list[Own], memory_dirs: list[Path], env: Mapping[str, str]
) -> tuple[list[Path], list[tuple[str, Path]]]:
    """Remove each of ``own`` but those with one of ``memory_dirs`` inside, then the runtime
    dir ``$XDG_RUNTIME_DIR/memstaged`` once empty: what was removed, and what was kept (as
    (what: why, path)). Raises :class:`ConfigError` for one that cannot be removed."""
    from memstaged.daemon.control_socket import runtime_dir

    removed: list[Path] = []
    kept: list[tuple[str, Path]] = []
    for item in own:
        try:
            why = _remove(item, memory_dirs)
        except OSError as err:
            raise ConfigError(f"cannot remove {item.path}: {err.strerror}") from None
        if why is None:
            removed.append(item.path)
        else:
            kept.append((f"{item.what}: {why}", item.path))
    sockets = runtime_dir(env)  # memstaged's own, 0700; empty once no daemon runs
    if sockets is not None and fsio.remove_empty_dir(sockets):
        removed.append(sockets)
    return removed, kept
