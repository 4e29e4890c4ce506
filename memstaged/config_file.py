"""The config file: its keys (:class:`FileConfig`), read and checked, with the words that say
what each key must be.

Every problem of the file is one line naming the file and the key (``config.toml: key 'settle':
must be a number of seconds from 0 to 604800, not "2s"``), never the parser's own words: an
unknown key, a value of the wrong type and one out of range read alike. A typo in a daemon's
config must not silently fall back to a default; the commands that only look read the file
leniently, leaving each bad key out and saying it. How the file's values are layered under the
options and the ``MEMSTAGED_*`` variables is :mod:`memstaged.config`'s.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from memstaged.errors import ConfigError
from memstaged.files import safe_open

#: The longest settle interval or rescan interval taken: a week. Longer ones (``1e308``,
#: ``inf``) overflow the timers, and mean a setting mistyped rather than wanted.
MAX_INTERVAL: Final = 7 * 86_400.0


#: The most rotated decision logs kept. Each rotation renames every one, missing or not:
#: ``log_backups = 99999999999999999999999`` would never finish one.
MAX_LOG_BACKUPS: Final = 1000


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


#: A config is a few lines; anything larger is not one (and is not read whole into memory).
MAX_CONFIG_SIZE: Final = 1 << 20


def read_config(path: Path) -> FileConfig:
    """Parse and check the TOML file; every problem is one line naming the file and the key."""
    return read_file(path)[0]


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
    "metrics_file_mode": lambda v: metrics_file_mode(v) is not None,
}


def in_range(key: str, value: Any) -> bool:
    """Whether ``value`` (of the key's type already) is in the range the key's type does not
    say: the same test for the file's key and for its ``MEMSTAGED_*`` variable."""
    check = _IN_RANGE.get(key)
    return check is None or bool(check(value))


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
    if not in_range(key, converted):
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


#: The most lines a lenient read says about the keys it left out.
MAX_PROBLEMS: Final = 20


def read_file(
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
    if len(problems) > MAX_PROBLEMS:  # a file of 30,000 bad keys is not 30,000 lines
        more = len(problems) - MAX_PROBLEMS + 1
        problems[MAX_PROBLEMS - 1 :] = [f"{path}: {more} more keys left out, not listed"]
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


#: The modes the metrics file may have: the owner reads and writes it; the group and others
#: may read it. Nothing else: it is data (no execute bit, no set-id or sticky bit), and one
#: that others could write would let them make the collector report what they like.
METRICS_FILE_MODES: Final = frozenset({0o600, 0o640, 0o604, 0o644})


def metrics_file_mode(text: str) -> int | None:
    """The mode ``text`` names (octal digits, ``"0640"`` or ``"640"``) when it is one of
    :data:`METRICS_FILE_MODES`, else None."""
    if 3 <= len(text) <= 4 and not text.strip("01234567"):
        mode = int(text, 8)
        if mode in METRICS_FILE_MODES:
            return mode
    return None
