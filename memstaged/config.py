"""Settings: command line, then environment, then the TOML file, then the default.

Each setting is resolved in one place (:func:`load`), so the CLI, the config file and the systemd
unit agree, and where each value came from is kept beside it (``config show``). A bad option or
variable is an error that names it; the file's own keys, read and checked, are
:mod:`memstaged.config_file`'s. Here too: the memory dirs the settings name (globs expanded,
aliases found, each named one checked) and the state dir, used only when it is the user's own.
"""

from __future__ import annotations

import glob
import math
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

import msgspec

from memstaged.config_file import (
    MAX_INTERVAL,
    MUST_BE,
    SETTING_NAMES,
    FileConfig,
    in_range,
    metrics_file_mode,
    read_file,
)
from memstaged.core.foreign import default_project_root, normalize
from memstaged.durations import parse_seconds
from memstaged.errors import ConfigError, NotPrivate
from memstaged.files import private_dirs
from memstaged.files.memdir import MemoryDir, Options, physical_path

DEFAULT_MEMORY_DIR: Final = "./.pi/memory/project"
ENV_PREFIX: Final = "MEMSTAGED_"


def is_memory_dir(path: str) -> bool:
    """SPEC 5: a directory with a ``staging/`` subdirectory.

    A ``staging`` that is a symbolic link counts too: it is never followed, but the memory dir
    is watched so that the pipeline reports the link (SPEC 6) instead of it going unnoticed.
    """
    try:
        st = os.lstat(os.path.join(path, "staging"))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return False
    return (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)) and os.path.isdir(path)


def interval(text: str, what: str = "--settle") -> float:
    """A number of seconds from the command line: finite, from 0 to :data:`MAX_INTERVAL`."""
    try:
        value = parse_seconds(text, "number")
    except ValueError as err:
        raise ConfigError(f"{what} {text!r}: {err}") from None
    return checked_interval(value, what)


def checked_interval(value: float, what: str) -> float:
    if not math.isfinite(value) or not 0 <= value <= MAX_INTERVAL:
        raise ConfigError(
            f"{what} must be a number of seconds from 0 to {MAX_INTERVAL:.0f}, got {value}"
        )
    return value


class SettingOrigin(msgspec.Struct, frozen=True):
    """Where a setting's value came from (``config show``, as ``git config --show-origin``)."""

    kind: Literal["option", "env", "file", "default"]
    #: The option (``--settle``), the variable (``MEMSTAGED_SETTLE``) or the file's path.
    source: str | None = None

    def __str__(self) -> str:
        return self.kind if self.source is None else f"{self.kind}:{self.source}"


DEFAULT: Final = SettingOrigin("default")


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a run needs, resolved."""

    config_path: str | None
    memory_dir_patterns: tuple[str, ...]
    project_roots: dict[str, str]
    options: Options
    rescan_interval: float
    observer: str
    log_file: Path
    log_max_bytes: int
    log_backups: int
    explicit_dirs: bool
    #: Where memstaged keeps its own state (the seen cache, the ack marks, the instance locks):
    #: ``$XDG_STATE_HOME/memstaged``, used only when it is the user's own (:func:`own_state_dir`).
    state_dir: Path | None = None
    #: The state dir as configured, links and all: the way to it is what is checked.
    state_path: Path | None = None
    #: Where the daemon writes its metrics; None: it does not.
    metrics_file: Path | None = None
    #: The metrics file's mode (:func:`memstaged.config_file.metrics_file_mode`).
    metrics_file_mode: int = 0o600
    #: Where each setting of :data:`SETTING_NAMES` (and ``config``, the file) came from.
    origins: dict[str, SettingOrigin] = {}
    #: The keys of the config file left out, their defaults used (a lenient :func:`load`).
    warnings: tuple[str, ...] = ()

    def values(self) -> dict[str, Any]:
        """Each setting's effective value, by the config file's key, as JSON values: what
        ``config show`` prints and a reload compares."""
        options = self.options
        return {
            "memory_dirs": list(self.memory_dir_patterns),
            "project_roots": dict(self.project_roots),
            "settle": options.settle,
            "max_file_size": options.max_file_size,
            "max_quarantine_copy": options.max_quarantine_copy,
            "split_invalid_candidates": options.split_invalid_candidates,
            "rescan_interval": self.rescan_interval,
            "observer": self.observer,
            "log_file": str(self.log_file),
            "log_max_bytes": self.log_max_bytes,
            "log_backups": self.log_backups,
            "metrics_file": "" if self.metrics_file is None else str(self.metrics_file),
            "metrics_file_mode": f"{self.metrics_file_mode:04o}",
        }

    def changed_from(self, old: Settings) -> dict[str, list[Any]]:
        """The settings (and the config file) whose value differs from ``old``'s, each as
        ``[old, new]``: what a reload logs, so that no change goes unsaid."""
        before = {"config": old.config_path, **old.values()}
        after = {"config": self.config_path, **self.values()}
        return {k: [before[k], v] for k, v in after.items() if before[k] != v}

    def memory_dirs(self) -> list[MemoryDir]:
        """Expand the patterns now: globs are re-expanded on every rescan and reload."""
        found: dict[str, MemoryDir] = {}
        for pattern in self.memory_dir_patterns:
            expanded = os.path.expanduser(pattern)
            if glob.has_magic(expanded):  # a match that is not a memory dir is just not one
                paths = [p for p in sorted(glob.glob(expanded)) if is_memory_dir(p)]
            else:
                paths = [expanded]
            anchor = _literal_prefix(expanded, derived=pattern == DEFAULT_MEMORY_DIR)
            for path in paths:
                absolute = normalize(os.path.abspath(path))  # abspath: links are not resolved
                if absolute not in found:
                    named, physical = self.project_root(absolute)
                    link = "" if physical == named else named
                    found[absolute] = MemoryDir(absolute, physical, anchor, named_root=link)
        return list(found.values())

    def project_root(self, memory_dir: str) -> tuple[str, str]:
        """The project root of ``memory_dir`` (absolute, normalized) as named (configured in
        ``project_roots`` or ``--project-root``, else three levels up), and its physical path,
        the one its files are compared with (SPEC 2.4)."""
        named = self.project_roots.get(memory_dir) or default_project_root(memory_dir)
        return named, physical_path(named)

    def literal_dirs(self) -> frozenset[str]:
        """The memory dirs named without a wildcard on the command line or in
        ``MEMSTAGED_MEMORY_DIRS``: one of these that cannot be worked on stops memstaged with
        exit 2. A glob's matches are only what it matched (README: "a glob match that is not a
        memory dir is just not one"): one that cannot be held (a link, a busy lock, no
        descriptor left) is reported and the others are worked on (SPEC 6).
        """
        if not self.explicit_dirs:
            return frozenset()
        return frozenset(
            normalize(os.path.abspath(os.path.expanduser(p)))
            for p in self.memory_dir_patterns
            if not glob.has_magic(os.path.expanduser(p))
        )


class Alias(NamedTuple):
    """A path to a memory dir that an earlier path already reaches."""

    mdir: MemoryDir
    first: MemoryDir

    @property
    def reason(self) -> str:
        return f"same directory as {self.first.path}"


def one_path_each(mdirs: Iterable[MemoryDir]) -> tuple[list[MemoryDir], list[Alias]]:
    """The memory dirs with one path each, and the other paths to them.

    Memory dirs are keyed by path, and a project root is derived from the path: through a bind
    mount or a linked literal prefix, one directory reached by two paths would be decided twice,
    with two project roots, and a file foreign by one would be moved by the other (SPEC 2.4). The
    directory's ``(st_dev, st_ino)`` tells: the first path in the order given (the order of
    configuration, then sorted glob matches) is kept and gives the project root. A path that cannot
    be opened has no identity and is kept, for its error to be said.
    """
    kept: list[MemoryDir] = []
    aliases: list[Alias] = []
    first: dict[tuple[int, int], MemoryDir] = {}
    for mdir in mdirs:
        dir_id = mdir.identity()
        if dir_id is None:
            kept.append(mdir)
        elif dir_id in first:
            aliases.append(Alias(mdir, first[dir_id]))
        else:
            first[dir_id] = mdir
            kept.append(mdir)
    return kept, aliases


def link_on_the_way(mdir: MemoryDir) -> str | None:
    """The first symbolic link between ``mdir.anchor`` and the memory dir itself, if any.

    SPEC 6: below the configured literal prefix a link is not followed "and is reported": this
    names it for the report. None when there is none (or no anchor: a literal path, whose
    prefix may contain links).
    """
    if not mdir.anchor:
        return None
    rel = os.path.relpath(mdir.path, mdir.anchor)
    if rel == "." or rel.startswith(".."):
        return None
    here = mdir.anchor
    for part in rel.split("/"):
        here = os.path.join(here, part)
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return here
        except (OSError, ValueError):
            return None
    return None


def _literal_prefix(pattern: str, *, derived: bool) -> str:
    """The directory of a pattern before its first wildcard: links are followed only there.

    SPEC 6: below it (what a glob matched, or ``.pi/memory/project`` of the default memory dir,
    which is derived from the working directory) no link is followed. ``""``: the memory dir's
    parent, for a path configured literally.
    """
    absolute = normalize(os.path.abspath(pattern))
    if derived:
        return os.getcwd()
    if not glob.has_magic(absolute):
        return ""
    parts = absolute.split("/")
    literal = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return "/".join(parts[:literal]) or "/"


def default_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME", "~"), ".config")
    return Path(os.path.expanduser(base)) / "memstaged" / "config.toml"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/memstaged``; ``~/.local/state/memstaged`` when it is unset or
    relative (the XDG spec: a relative path is to be ignored)."""
    base = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(env.get("HOME", "~"), ".local", "state")
    return Path(os.path.expanduser(base)) / "memstaged"


def physical_state_dir(env: Mapping[str, str]) -> Path:
    """The state dir with every link on its way resolved, once, when the settings are made:
    the directories checked (:func:`own_state_dir`) are those used from then on, whatever a
    link on the way is later made to point to."""
    given = default_state_dir(env)
    try:
        return Path(private_dirs.walk_to(given))
    except OSError:
        return given  # a way that leads nowhere: own_state_dir says why


def default_log_file(env: Mapping[str, str]) -> Path:
    return default_state_dir(env) / "decisions.jsonl"


def own_state_dir(settings: Settings, *, create: bool = True) -> Path | None:
    """The state dir, made 0700 if ``create`` and missing, and refused (:class:`ConfigError`,
    one line) unless it is the user's own and private, as ssh refuses such a directory: what
    memstaged keeps there (the seen cache, the ack marks, the instance locks, by default the
    decision log) is trusted, and another user who made it first could have put anything
    there. ``None`` when there is none (and it is not to be made)."""
    if settings.state_dir is None:
        return None
    try:
        private_dirs.check_ancestors(settings.state_path or settings.state_dir)
        exists = private_dirs.private_dir(settings.state_dir, create=create)
    except NotPrivate as err:
        raise ConfigError(f"state dir: {err.strerror}") from None
    except OSError as err:
        raise ConfigError(f"state dir {settings.state_dir}: {err.strerror or err}") from None
    return settings.state_dir if exists else None


def _env_value(env: Mapping[str, str], name: str, kind: type, option: str) -> Any:
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw == "":
        return None
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(
            f"{ENV_PREFIX}{name}={raw!r}: must be true or false (1, yes, on; 0, no, off) ({option})"
        )
    try:
        value = kind(raw)
    except ValueError:
        value = math.nan  # said below, in the setting's own words
    if kind is float and not in_range("settle", value):
        raise ConfigError(f"{ENV_PREFIX}{name}={raw!r}: must be {MUST_BE['settle']} ({option})")
    return value


def _pick(cli: Any, env: Any, file_value: Any) -> Any:
    return cli if cli is not None else env if env is not None else file_value


def _memory_dir_patterns(
    memory_dirs: list[str] | None, env: Mapping[str, str], file_config: FileConfig
) -> tuple[list[str], bool, SettingOrigin | None]:
    """The memory-dir patterns: the options, else ``MEMSTAGED_MEMORY_DIRS``, else the file's,
    else ``./.pi/memory/project`` when it is one. Also whether they were named explicitly
    (option or variable), and where they came from (None: the file's, as for any key)."""
    patterns = list(memory_dirs or [])
    check_patterns(tuple(patterns))
    if patterns:
        return patterns, True, SettingOrigin("option", "--memory-dir")
    env_dirs = env.get(ENV_PREFIX + "MEMORY_DIRS")
    if env_dirs:
        return env_dirs.split(os.pathsep), True, SettingOrigin("env", ENV_PREFIX + "MEMORY_DIRS")
    if not file_config.memory_dirs and is_memory_dir(DEFAULT_MEMORY_DIR):
        return [DEFAULT_MEMORY_DIR], False, DEFAULT
    return list(file_config.memory_dirs), False, None


class _ConfigFile(NamedTuple):
    path: Path
    #: The path when it was read (a named one must exist, the default one may not).
    used: str | None
    values: FileConfig
    #: The keys it sets.
    present: frozenset[str]
    origin: SettingOrigin
    #: The keys left out of ``values`` (lenient only), one line each.
    problems: tuple[str, ...] = ()


def _config_file(config: str | None, env: Mapping[str, str], *, lenient: bool) -> _ConfigFile:
    """The config file: ``--config``, else ``MEMSTAGED_CONFIG``, else the default path."""
    explicit = config or env.get(ENV_PREFIX + "CONFIG")
    path = Path(explicit) if explicit else default_config_path(env)
    origin = SettingOrigin("option", "--config") if config else DEFAULT
    if explicit and not config:
        origin = SettingOrigin("env", ENV_PREFIX + "CONFIG")
    if explicit or _present(path):
        file_config, present, problems = read_file(path, lenient=lenient)
        return _ConfigFile(path, str(path), file_config, present, origin, problems)
    return _ConfigFile(path, None, FileConfig(), frozenset(), origin)


def _present(path: Path) -> bool:
    """Whether the default config file is there: a missing one (or a missing directory on the
    way) means defaults; one that cannot be looked at (a directory without search permission)
    is an error, not a file silently left out."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    return True


def load(
    *,
    config: str | None = None,
    memory_dirs: list[str] | None = None,
    project_root: str | None = None,
    settle: float | None = None,
    dry_run: bool = False,
    split_invalid_candidates: bool | None = None,
    env: Mapping[str, str] | None = None,
    lenient: bool = False,
) -> Settings:
    """Resolve every setting: argument, then ``MEMSTAGED_*`` variable, then file, then default.

    Each setting's origin is kept beside it (``Settings.origins``), decided here with its value,
    so that ``config show`` cannot say otherwise than what a run uses.

    A key of the file that is unknown or has a bad value is an error, unless ``lenient`` (the
    commands that only look): then it is left out, its default used, and said in
    ``Settings.warnings``. A file that cannot be read or parsed, and a bad option or variable,
    are errors either way.
    """
    env = os.environ if env is None else env
    found = _config_file(config, env, lenient=lenient)
    config_path, used_config, file_config, present = found[:4]
    config_origin = found.origin
    origins = {"config": config_origin}
    file_origin = SettingOrigin("file", str(config_path))

    def origin(key: str, option: str | None = None, variable: str | None = None) -> SettingOrigin:
        """The first layer that set ``key``: the option given, the variable set, the file."""
        if option is not None:
            return SettingOrigin("option", option)
        if variable is not None:
            return SettingOrigin("env", ENV_PREFIX + variable)
        return file_origin if key in present else DEFAULT

    for key in SETTING_NAMES:
        origins[key] = origin(key)
    patterns, explicit, dirs_origin = _memory_dir_patterns(memory_dirs, env, file_config)
    origins["memory_dirs"] = dirs_origin or origins["memory_dirs"]
    roots = {
        normalize(os.path.abspath(os.path.expanduser(k))): normalize(
            os.path.abspath(os.path.expanduser(v))
        )
        for k, v in file_config.project_roots.items()
    }
    if project_root is not None:
        if len(patterns) != 1 or glob.has_magic(patterns[0]):
            raise ConfigError("--project-root needs exactly one memory dir (--memory-dir DIR)")
        key = normalize(os.path.abspath(os.path.expanduser(patterns[0])))
        roots[key] = normalize(os.path.abspath(os.path.expanduser(project_root)))
        origins["project_roots"] = origin("project_roots", option="--project-root")
    env_settle = _env_value(env, "SETTLE", float, "--settle")
    settle_value = _pick(settle, env_settle, None)
    if settle_value is None:
        settle_value = checked_interval(file_config.settle, f"{config_path}: key 'settle'")
    checked_interval(settle_value, "--settle")
    if settle is not None or env_settle is not None:
        origins["settle"] = origin(
            "settle",
            option="--settle" if settle is not None else None,
            variable="SETTLE" if env_settle is not None else None,
        )
    env_split = _env_value(env, "SPLIT_INVALID_CANDIDATES", bool, "split_invalid_candidates")
    split = _pick(split_invalid_candidates, env_split, file_config.split_invalid_candidates)
    if split_invalid_candidates is not None or env_split is not None:
        origins["split_invalid_candidates"] = origin(
            "split_invalid_candidates",
            option="--split-invalid-candidates" if split_invalid_candidates is not None else None,
            variable="SPLIT_INVALID_CANDIDATES" if env_split is not None else None,
        )
    observer = env.get(ENV_PREFIX + "OBSERVER") or file_config.observer
    if observer not in ("auto", "inotify", "polling"):
        raise ConfigError(f"{ENV_PREFIX}OBSERVER={observer!r}: expected auto, inotify or polling")
    if env.get(ENV_PREFIX + "OBSERVER"):
        origins["observer"] = origin("observer", variable="OBSERVER")
    log_file = env.get(ENV_PREFIX + "LOG_FILE") or file_config.log_file
    if env.get(ENV_PREFIX + "LOG_FILE"):
        origins["log_file"] = origin("log_file", variable="LOG_FILE")
    elif not file_config.log_file:
        origins["log_file"] = DEFAULT  # log_file = "" in the file means the default
    log_path = Path(os.path.expanduser(log_file)) if log_file else default_log_file(env)
    check_log_file(log_path)
    metrics_file = env.get(ENV_PREFIX + "METRICS_FILE") or file_config.metrics_file
    if env.get(ENV_PREFIX + "METRICS_FILE"):
        origins["metrics_file"] = origin("metrics_file", variable="METRICS_FILE")
    elif not file_config.metrics_file:
        origins["metrics_file"] = DEFAULT  # metrics_file = "" in the file: none, the default
    return Settings(
        config_path=used_config,
        memory_dir_patterns=tuple(patterns),
        project_roots=roots,
        options=Options(
            settle=settle_value,
            max_file_size=file_config.max_file_size,
            max_quarantine_copy=file_config.max_quarantine_copy,
            split_invalid_candidates=split,
            dry_run=dry_run,
        ),
        rescan_interval=file_config.rescan_interval,
        observer=observer,
        log_file=log_path,
        log_max_bytes=file_config.log_max_bytes,
        log_backups=file_config.log_backups,
        metrics_file=Path(os.path.expanduser(metrics_file)) if metrics_file else None,
        # A mode that is not one of METRICS_FILE_MODES was refused when the file was read.
        metrics_file_mode=metrics_file_mode(file_config.metrics_file_mode) or 0o600,
        explicit_dirs=explicit,
        state_dir=physical_state_dir(env),
        state_path=default_state_dir(env),
        origins=origins,
        warnings=found.problems,
    )


def check_log_file(path: Path) -> None:
    """The decision log is a regular file or a path where one can be made.

    Checked for every command, before anything opens it: a FIFO that nobody reads would block
    every writer and reader of the log, and a device or ``/dev/null`` keeps nothing, which would
    let changes be carried out with nothing logged (SPEC 5 and 7). ``stat`` follows a link, as
    the log itself does (the user named this path), and never blocks. Any other trouble (no
    such directory yet, no permission) is left to the open, which says it.
    """
    from memstaged.log.rotated_file import not_a_log_file

    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"log file {path}: {not_a_log_file(st.st_mode)}")


def check_patterns(patterns: tuple[str, ...]) -> None:
    """An empty ``--memory-dir ''`` would mean the current directory: refused, not guessed."""
    for pattern in patterns:
        if not pattern.strip():
            raise ConfigError("memory dir '': empty; a memory dir is <project>/.pi/memory/project")


def check_literal_dirs(settings: Settings, mdirs: list[MemoryDir]) -> frozenset[str]:
    """Of ``mdirs``, each one named literally (``--memory-dir``, ``memory_dirs`` without a glob)
    must be a memory dir (:func:`check_memory_dir`: exit 2); a glob's matches are only what it
    matched, and one that is not writable is said and skipped by the caller, not refused.
    Returns the literal paths (:meth:`Settings.literal_dirs`)."""
    literal = settings.literal_dirs()
    for mdir in mdirs:
        if mdir.path in literal:
            check_memory_dir(mdir, writable=not settings.options.dry_run)
    return literal


def check_memory_dir(mdir: MemoryDir, *, writable: bool) -> None:
    """A memory dir named on the command line must be one (SPEC 5: a directory with a
    ``staging/`` subdirectory), and writable when memstaged is to change it.

    A project root, ``/`` or a typo is refused rather than watched as an empty memory dir: a
    silent ``total=0`` looks like success.
    """
    path = Path(mdir.path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"memory dir {mdir.path} does not exist") from None
    except (OSError, ValueError) as err:  # ENAMETOOLONG, ELOOP, EACCES, a NUL
        why = err.strerror if isinstance(err, OSError) else str(err)
        raise ConfigError(f"memory dir {mdir.path}: {why}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"memory dir {mdir.path} is not a directory")
    if not is_memory_dir(mdir.path):
        hint = ""
        nested = os.path.join(mdir.path, ".pi", "memory", "project")
        if is_memory_dir(nested):
            hint = f"; did you mean {nested}?"
        raise ConfigError(
            f"{mdir.path} is not a memory dir: it has no staging/ subdirectory "
            f"(a memory dir is <project>/.pi/memory/project){hint}"
        )
    why = unwritable(mdir) if writable else None
    if why is not None:
        raise ConfigError(f"memory dir {mdir.path}: {why}")


def unwritable(mdir: MemoryDir) -> str | None:
    """Why memstaged cannot change ``mdir`` (it is not writable), or None.

    A literal memory dir that is not is exit 2 (:func:`check_memory_dir`); a glob's match that
    is not is reported and left undecided, and the others are decided.
    """
    if not os.access(mdir.path, os.W_OK | os.X_OK):
        return "not writable"
    return None  # a staging/ that cannot be read or written is said when it is listed
