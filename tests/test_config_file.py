"""The config file read and checked: every problem one line naming the file and the key, in
the config's own words; a lenient read leaves bad keys out and says each."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstaged import config, config_file
from memstaged.errors import ConfigError


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("observer = 'fast'\n", "key 'observer'"),
        ("max_file_size = 0\n", "key 'max_file_size': must be a whole number of bytes greater"),
        ("settle = [\n", "not valid TOML"),
        ("[project_roots]\nx = 1\n", "key 'project_roots.x'"),
        ("rescan_interval = 0\n", "key 'rescan_interval': must be a number of seconds greater"),
        ("log_backups = -1\n", "key 'log_backups': must be a whole number from 0 to 1000"),
        ("log_backups = 99999999999999999999999\n", "'log_backups': must be a whole number from"),
    ],
    ids=[
        "bad-enum",
        "bad-size",
        "bad-toml",
        "bad-root-type",
        "bad-rescan",
        "bad-backups",
        "huge-backups",
    ],
)
def test_bad_config_values_are_named(tmp_path: Path, text: str, message: str) -> None:
    """Every config problem is one message naming the file and the key."""
    cfg = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(config=cfg, env={}, memory_dirs=["m"])
    assert message in str(err.value)
    assert cfg in str(err.value)


def test_a_config_that_is_a_fifo_or_huge_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """Issue 13 item 4 (found by the argv fuzz test): ``--config`` naming a FIFO used to block for
    ever in open(); a config larger than 1 MiB is refused rather than read whole."""
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        config_file.read_config(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (config_file.MAX_CONFIG_SIZE + 1))
    with pytest.raises(ConfigError, match="larger than"):
        config_file.read_config(huge)


def test_metrics_file_mode_is_0600_by_default_and_only_a_readable_data_file_mode(
    tmp_path: Path,
) -> None:
    """Issue 31 item 2: `metrics_file_mode` is "0600" unless set (SPEC 6); "0640", "640",
    "0644" and "0604" are taken (read and write for the owner, read for the group or others);
    a mode with an execute, set-id or sticky bit, write for others, not octal, or a bare TOML
    number is refused in one line naming the file and the key; `config show` and a reload see it."""
    env = {"HOME": str(tmp_path)}
    default = config.load(config=_write(tmp_path, "memory_dirs = []\n"), env=env)
    assert default.metrics_file_mode == 0o600
    assert default.values()["metrics_file_mode"] == "0600"
    assert str(default.origins["metrics_file_mode"]) == "default"
    for text, mode in (("0640", 0o640), ("640", 0o640), ("0644", 0o644), ("0604", 0o604)):
        cfg = _write(tmp_path, f'metrics_file_mode = "{text}"\n')
        settings = config.load(config=cfg, env=env)
        assert settings.metrics_file_mode == mode
        assert str(settings.origins["metrics_file_mode"]) == f"file:{cfg}"
    assert settings.changed_from(default) == {"metrics_file_mode": ["0600", "0604"]}
    for bad in ('"0755"', '"4644"', '"0666"', '"0646"', '"0400"', '"0o644"', '"rw-r--r--"', '""'):
        cfg = _write(tmp_path, f"metrics_file_mode = {bad}\n")
        with pytest.raises(ConfigError) as err:
            config.load(config=cfg, env=env)
        assert str(err.value) == (
            f'{cfg}: key \'metrics_file_mode\': must be "0600", "0604", "0640" or '
            '"0644" (octal, in quotes: read and write for the owner, read for the group or '
            f"others, nothing else), not {bad}"
        )
    with pytest.raises(ConfigError, match=r"key 'metrics_file_mode': .* not 420$"):
        config.load(config=_write(tmp_path, "metrics_file_mode = 0o644\n"), env=env)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'settle = "2s"\n',
            "key 'settle': must be a number of seconds from 0 to 604800, not \"2s\"",
        ),
        ("settle = -1\n", "key 'settle': must be a number of seconds from 0 to 604800, not -1"),
        (
            "rescan_interval = true\n",
            "key 'rescan_interval': must be a number of seconds greater than 0 and at most "
            "604800, not true",
        ),
        (
            'split_invalid_candidates = "yes"\n',
            "key 'split_invalid_candidates': must be true or false, not \"yes\"",
        ),
        (
            'memory_dirs = "~/src/*/.pi/memory/project"\n',
            "key 'memory_dirs': must be a list of paths (strings; globs and ~ allowed), "
            'not "~/src/*/.pi/memory/project"',
        ),
        (
            'memory_dirs = ["~/a", 3]\n',
            "key 'memory_dirs': must be a list of paths (strings; globs and ~ allowed), "
            "not a list holding 3",
        ),
        (
            'observer = "fast"\n',
            'key \'observer\': must be "auto", "inotify" or "polling", not "fast"',
        ),
        (
            "log_file = 3\n",
            "key 'log_file': must be a path (a string), or \"\" for the default, not 3",
        ),
        (
            "metrics_file = []\n",
            "key 'metrics_file': must be a path (a string), or \"\" for none, not a list",
        ),
        (
            "max_file_size = 1.5\n",
            "key 'max_file_size': must be a whole number of bytes greater than 0, not 1.5",
        ),
        (
            'log_max_bytes = "10M"\n',
            "key 'log_max_bytes': must be a whole number of bytes greater than 0, not \"10M\"",
        ),
        (
            "project_roots = 3\n",
            "key 'project_roots': must be a table of memory dir = project root paths, not 3",
        ),
        (
            "[project_roots]\nx = 1\n",
            "key 'project_roots.x': must be a project root path (a string), not 1",
        ),
    ],
    ids=[
        "seconds-type",
        "seconds-range",
        "seconds-bool",
        "bool",
        "list-of-paths-string",
        "list-of-paths-element",
        "choice",
        "path",
        "path-or-none",
        "bytes-float",
        "bytes-string",
        "table",
        "table-entry",
    ],
)
def test_a_bad_value_is_said_in_the_config_s_own_words(
    tmp_path: Path, text: str, message: str
) -> None:
    """Issue 31 item 11: a value of the wrong type reads like a value out of range: the file,
    the key, what the key must be in words, and the value given as the file has it; never
    msgspec's `Expected float, got str`."""
    cfg = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(config=cfg, env={}, memory_dirs=["m"])
    assert str(err.value) == f"{cfg}: {message}"
    assert "Expected" not in str(err.value)


def test_every_key_says_in_words_what_it_must_be() -> None:
    """Issue 31 item 11: each key of the config file has its own words (a key added without
    them would be said by its type alone: `a whole number`)."""
    assert set(config_file.MUST_BE) == set(config_file.SETTING_NAMES)


def test_a_lenient_load_leaves_bad_keys_out_and_says_each_once(tmp_path: Path) -> None:
    """Issue 31 item 10: for the commands that only look, each unknown key and each bad value
    is left out (its default used, its origin `default`) and said in one line naming the file
    and the key; the good keys are kept. A strict load refuses the same file on its first
    problem."""
    memory = tmp_path / "p" / ".pi" / "memory" / "project"
    cfg = _write(
        tmp_path,
        f'memory_dirs = ["{memory}"]\nsettel = 3\nsettle = "2s"\nlog_backups = 2\n'
        '[project_roots]\n"/a" = "/b"\n"/c" = 4\n',
    )
    settings = config.load(config=cfg, env={}, lenient=True)
    assert settings.warnings == (
        f"{cfg}: unknown key 'settel' (did you mean 'settle'?); left out",
        f"{cfg}: key 'settle': must be a number of seconds from 0 to 604800, not \"2s\"; left "
        "out, its default used",
        f"{cfg}: key 'project_roots./c': must be a project root path (a string), not 4; left out",
    )
    assert settings.options.settle == 2.0
    assert str(settings.origins["settle"]) == "default"
    assert settings.log_backups == 2
    assert settings.memory_dir_patterns == (str(memory),)
    assert settings.project_roots == {"/a": "/b"}
    with pytest.raises(ConfigError, match="unknown key 'settel'"):
        config.load(config=cfg, env={})


def test_a_lenient_load_says_at_most_a_bounded_number_of_lines(tmp_path: Path) -> None:
    """A config file of 30,000 unknown keys gave `status` 30,000 warning lines. The lenient
    load says the first keys it left out, then how many more, in MAX_PROBLEMS lines."""
    cfg = _write(tmp_path, "".join(f"k{i} = 1\n" for i in range(30_000)))
    warnings = config.load(config=cfg, env={}, lenient=True).warnings
    assert len(warnings) == config_file.MAX_PROBLEMS
    assert warnings[0] == f"{cfg}: unknown key 'k0'; left out"
    assert (
        warnings[-1]
        == f"{cfg}: {30_000 - config_file.MAX_PROBLEMS + 1} more keys left out, not listed"
    )


@pytest.mark.parametrize(
    "text", ["settle = [\n", b"settle = 2\n\xff\n"], ids=["not-toml", "not-utf8"]
)
def test_a_config_that_cannot_be_parsed_is_an_error_even_for_a_lenient_load(
    tmp_path: Path, text: str | bytes
) -> None:
    """Issue 31 item 10: a file that is not TOML tells nothing that can be trusted (not even
    which memory dirs or which log): every command refuses it, the lenient ones too."""
    path = tmp_path / "config.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=r"not valid TOML|not UTF-8"):
        config.load(config=str(path), env={}, memory_dirs=["m"], lenient=True)
