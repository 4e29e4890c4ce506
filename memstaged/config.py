"""Settings: command line, then environment, then the TOML file, then the default.

Each setting is resolved in one place (:func:`load`), so the CLI, the config file and the systemd
unit agree. Unknown keys and wrong types are errors that name the file and the key: a typo in a
daemon's config must not silently fall back to a default.
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

from memstaged.core.foreign import default_project_root, normalize
from memstaged.durations import parse_seconds
from memstaged.errors import ConfigError, NotPrivate
from memstaged.files import private_dirs, safe_open
from memstaged.files.memdir import MemoryDir, Options, physical_path

DEFAULT_MEMORY_DIR: Final = "./.pi/memory/project"
ENV_PREFIX: Final = "MEMSTAGED_"
#: The longest settle interval or rescan interval taken: a week. Longer ones (``1e308``,
#: ``inf``) overflow the timers, and mean a setting mistyped rather than wanted.
MAX_INTERVAL: Final = 7 * 86_400.0
#: The most rotated decision logs kept. Each rotation renames every one, missing or not:
#: ``log_backups = 99999999999999999999999`` would never finish one.
MAX_LOG_BACKUPS: Final = 1000


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


class FileConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The TOML file's schema; every key is documented in ``config.example.toml``."""

    memory_dirs: list[str] = []
    project_roots: dict[str, str] = {}
    settle: float = 2.0
    max_file_size: int = 8 * 1024 * 1024
    max_quarantine_copy: int = 1 << 30
    split_invalid_candidates: bool = False
    rescan_interval: float = 300.0
    observer: Literal["auto", "inotify", "polling"] = "auto"
    log_file: str = ""
    log_max_bytes: int = 10 * 1024 * 1024
    log_backups: int = 5
    metrics_file: str = ""
    #: Octal, as ``chmod`` takes it: a number in TOML would be read as decimal.
    metrics_file_mode: str = "0600"


#: The settings, in the order ``config show`` lists them: the config file's keys.
SETTING_NAMES: Final = FileConfig.__struct_fields__


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
    #: The metrics file's mode (:func:`metrics_file_mode`).
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


#: A config is a few lines; anything larger is not one (and is not read whole into memory).
MAX_CONFIG_SIZE: Final = 1 << 20


def read_config(path: Path) -> FileConfig:
    """Parse and check the TOML file; every problem is one line naming the file and the key."""
    return _read_config(path)[0]


#: What each key of the config file must be, in words: said alike for a value of the wrong type
#: (``settle = "2s"``) and for one out of range (``settle = -1``).
MUST_BE: Final[dict[str, str]] = {
    "memory_dirs": "a list of paths (strings; globs and ~ allowed)",
    "project_roots": "a table of memory dir = project root paths",
    "settle": f"a number of seconds from 0 to {MAX_INTERVAL:.0f}",
    "max_file_size": "a whole number of bytes greater than 0",
    "max_quarantine_copy": "a whole number of bytes (0 or more; 0: never copy)",
    "split_invalid_candidates": "true or false",
    "rescan_interval": f"a number of seconds greater than 0 and at most {MAX_INTERVAL:.0f}",
    "observer": '"auto", "inotify" or "polling"',
    "log_file": 'a path (a string), or "" for the default',
    "log_max_bytes": "a whole number of bytes greater than 0",
    "log_backups": f"a whole number from 0 to {MAX_LOG_BACKUPS}",
    "metrics_file": 'a path (a string), or "" for none',
    "metrics_file_mode": '"0600", "0604", "0640" or "0644" (octal, in quotes: read and write '
    "for the owner, read for the group or others, nothing else)",
}


def _seconds(low_open: bool) -> Any:
    def check(value: float) -> bool:
        above = value > 0 if low_open else value >= 0
        return math.isfinite(value) and above and value <= MAX_INTERVAL

    return check


#: The ranges a key's type does not say, as a test of its (converted) value.
_IN_RANGE: Final[dict[str, Any]] = {
    "settle": _seconds(low_open=False),
    "rescan_interval": _seconds(low_open=True),
    "max_file_size": lambda v: v > 0,
    "max_quarantine_copy": lambda v: v >= 0,
    "log_max_bytes": lambda v: v > 0,
    "log_backups": lambda v: 0 <= v <= MAX_LOG_BACKUPS,
    "metrics_file_mode": lambda v: _mode(v) is not None,
}


def must_be(key: str) -> str:
    """What ``key`` must be, in words; for a key :data:`MUST_BE` forgot, its type's words."""
    if key in MUST_BE:
        return MUST_BE[key]
    kind = FileConfig.__annotations__.get(key, "")
    words = {"int": "a whole number", "float": "a number", "bool": "true or false"}
    return words.get(str(kind), "a string" if "str" in str(kind) else "a valid value")


def shown(value: object) -> str:
    """A value as the TOML file has it, short: ``"2s"``, ``true``, ``1.5``, ``a list``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        import json

        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 42 else text[:40] + '..."'
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 40 else text[:20] + "..."
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__} ({value})"  # a TOML date or time


def _key_problem(key: str, value: Any) -> str | None:
    """Why ``key = value`` cannot be taken, in the config's own words, or None."""
    try:
        one = msgspec.convert({key: value}, FileConfig)
    except (msgspec.ValidationError, RecursionError):
        odd = [v for v in value if not isinstance(v, str)] if isinstance(value, list) else []
        if odd and key == "memory_dirs":  # say which element: "not a list" would puzzle
            return f"must be {must_be(key)}, not a list holding {shown(odd[0])}"
        return f"must be {must_be(key)}, not {shown(value)}"
    converted = getattr(one, key)
    check = _IN_RANGE.get(key)
    if check is not None and not check(converted):
        return f"must be {must_be(key)}, not {shown(value)}"
    paths = converted if isinstance(converted, list) else [converted]
    if any(isinstance(p, str) and "\x00" in p for p in paths):  # TOML allows "\u0000"
        return "a path cannot hold a NUL byte"
    return None


def _root_problem(key: str, value: Any) -> str | None:
    """Why an entry of ``[project_roots]`` cannot be taken, or None."""
    if not isinstance(value, str):
        return f"must be a project root path (a string), not {shown(value)}"
    if "\x00" in value or "\x00" in key:
        return "a path cannot hold a NUL byte"
    return None


def _read_config(
    path: Path, *, lenient: bool = False
) -> tuple[FileConfig, frozenset[str], tuple[str, ...]]:
    """:func:`read_config`, the keys the file sets (the others are defaults), and, when
    ``lenient``, the problems of the keys it left out (each one line naming the file and the
    key) instead of raising the first of them. A file that cannot be read or parsed is an
    error either way: nothing of it can be trusted."""
    raw = _parse_toml(path)
    problems: list[str] = []
    left_out, defaulted = ("; left out", ", its default used") if lenient else ("", "")
    for key in list(raw):
        if key not in SETTING_NAMES:
            problems.append(f"{path}: unknown key '{key}'{_did_you_mean(key)}{left_out}")
            del raw[key]
        elif key == "project_roots" and isinstance(raw[key], dict):
            for entry, root in list(raw[key].items()):
                why = _root_problem(entry, root)
                if why is not None:
                    problems.append(f"{path}: key 'project_roots.{entry}': {why}{left_out}")
                    del raw[key][entry]
        elif (why := _key_problem(key, raw[key])) is not None:
            problems.append(f"{path}: key '{key}': {why}{left_out}{defaulted}")
            del raw[key]
    if problems and not lenient:
        raise ConfigError(problems[0])
    try:
        parsed = msgspec.convert(raw, FileConfig)  # every key was checked on its own above
    except (msgspec.ValidationError, RecursionError) as err:  # pragma: no cover - defensive
        raise ConfigError(f"{path}: {err}") from None
    return parsed, frozenset(raw), tuple(problems)


def _parse_toml(path: Path) -> dict[str, Any]:
    """The file's TOML as a dict; a file that cannot be read, is not UTF-8 or not TOML is one
    line (:class:`ConfigError`)."""
    import tomllib  # only when there is a config file (start-up)

    try:
        # Links are followed, as the user named this path (dotfile managers link configs).
        data = safe_open.read_private(path, MAX_CONFIG_SIZE, follow=True)
        return tomllib.loads(data.decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 (byte {err.start}), as TOML must be") from None
    except RecursionError:  # tomllib recurses once per level of an array or inline table
        raise ConfigError(f"{path}: not valid TOML: a value is nested too deep") from None
    except ValueError:  # os.open refuses a path with a NUL byte: no file has such a name
        raise ConfigError(f"{path}: cannot read: a path cannot hold a NUL byte") from None


def _did_you_mean(key: str) -> str:
    """`` (did you mean 'settle'?)`` for a typo of a key, else nothing."""
    import difflib  # only for an unknown key

    close = difflib.get_close_matches(key, SETTING_NAMES, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


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
    if kind is float and not _seconds(low_open=False)(value):
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
    if explicit or path.exists():
        file_config, present, problems = _read_config(path, lenient=lenient)
        return _ConfigFile(path, str(path), file_config, present, origin, problems)
    return _ConfigFile(path, None, FileConfig(), frozenset(), origin)


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
        metrics_file_mode=_mode(file_config.metrics_file_mode) or 0o600,  # checked on reading
        explicit_dirs=explicit,
        state_dir=physical_state_dir(env),
        state_path=default_state_dir(env),
        origins=origins,
        warnings=found.problems,
    )


#: The modes the metrics file may have: the owner reads and writes it; the group and others
#: may read it. Nothing else: it is data (no execute bit, no set-id or sticky bit), and one
#: that others could write would let them make the collector report what they like.
METRICS_FILE_MODES: Final = frozenset({0o600, 0o640, 0o604, 0o644})


def _mode(text: str) -> int | None:
    """The mode ``text`` names (octal digits, ``"0640"`` or ``"640"``) when it is one of
    :data:`METRICS_FILE_MODES`, else None."""
    if 3 <= len(text) <= 4 and not text.strip("01234567"):
        mode = int(text, 8)
        if mode in METRICS_FILE_MODES:
            return mode
    return None


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
