"""Settings resolution: option, then MEMSTAGED_* variable, then the file, then the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstaged import config
from memstaged.errors import ConfigError


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_option_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    """Each layer overrides the one below it, for the same setting."""
    cfg = _write(tmp_path, "settle = 3.0\n")
    env = {"HOME": str(tmp_path)}
    assert config.load(env=env, memory_dirs=["m"]).options.settle == 2.0
    assert config.load(config=cfg, env=env, memory_dirs=["m"]).options.settle == 3.0
    env["MEMSTAGED_SETTLE"] = "4"
    assert config.load(config=cfg, env=env, memory_dirs=["m"]).options.settle == 4.0
    assert config.load(config=cfg, env=env, memory_dirs=["m"], settle=5).options.settle == 5.0


def test_default_paths_follow_xdg(tmp_path: Path) -> None:
    """The config file and the log default to the XDG directories."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_STATE_HOME": str(tmp_path / "s")}
    (tmp_path / "c" / "memstaged").mkdir(parents=True)
    (tmp_path / "c" / "memstaged" / "config.toml").write_text("split_invalid_candidates = true\n")
    settings = config.load(env=env, memory_dirs=["m"])
    assert settings.config_path == str(tmp_path / "c" / "memstaged" / "config.toml")
    assert settings.options.split_invalid_candidates is True
    assert settings.log_file == tmp_path / "s" / "memstaged" / "decisions.jsonl"


@pytest.mark.parametrize(
    ("name", "value"), [("MEMSTAGED_SETTLE", "x"), ("MEMSTAGED_OBSERVER", "fast")]
)
def test_bad_environment_value_is_named(tmp_path: Path, name: str, value: str) -> None:
    """A malformed MEMSTAGED_* value names the variable instead of falling back silently."""
    with pytest.raises(ConfigError, match=f"{name}='{value}'"):
        config.load(env={name: value, "HOME": str(tmp_path)}, memory_dirs=["m"])


def test_project_roots_table_and_default_root(tmp_path: Path) -> None:
    """A memory dir's root is three levels up unless [project_roots] names another."""
    a = tmp_path / "a" / ".pi" / "memory" / "project"
    b = tmp_path / "b" / ".pi" / "memory" / "project"
    cfg = _write(tmp_path, f'memory_dirs = ["{a}", "{b}"]\n[project_roots]\n"{b}" = "/srv/b"\n')
    dirs = {m.path: m.project_root for m in config.load(config=cfg, env={}).memory_dirs()}
    assert dirs == {str(a): str(tmp_path / "a"), str(b): "/srv/b"}


def test_globs_are_expanded_when_asked(tmp_path: Path) -> None:
    """A glob is expanded at each call, so memory dirs created later are found."""
    settings = config.load(env={}, memory_dirs=[f"{tmp_path}/*/.pi/memory/project"])
    assert settings.memory_dirs() == []
    (tmp_path / "new" / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    assert [m.path for m in settings.memory_dirs()] == [
        str(tmp_path / "new" / ".pi" / "memory" / "project")
    ]


def test_each_setting_has_the_origin_of_the_layer_that_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 9 (`config show`): the origin kept beside each value is the layer its value
    came from: the memory dirs from MEMSTAGED_MEMORY_DIRS, else the file, else the
    ./.pi/memory/project found here; `log_file = ""` in the file is the default's path."""
    cfg = _write(tmp_path, 'memory_dirs = []\nlog_file = ""\nlog_backups = 2\n')
    env = {"HOME": str(tmp_path), "MEMSTAGED_SPLIT_INVALID_CANDIDATES": "yes"}
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    settings = config.load(config=cfg, env=env)
    shown = {key: str(origin) for key, origin in settings.origins.items()}
    assert shown == {
        "config": "option:--config",
        "memory_dirs": "default",
        "project_roots": "default",
        "settle": "default",
        "max_file_size": "default",
        "max_quarantine_copy": "default",
        "split_invalid_candidates": "env:MEMSTAGED_SPLIT_INVALID_CANDIDATES",
        "rescan_interval": "default",
        "observer": "default",
        "log_file": "default",
        "log_max_bytes": "default",
        "log_backups": f"file:{cfg}",
        "metrics_file": "default",
        "metrics_file_mode": "default",
    }
    assert settings.memory_dir_patterns == (config.DEFAULT_MEMORY_DIR,)
    env["MEMSTAGED_MEMORY_DIRS"] = "/a:/b"
    settings = config.load(config=cfg, env=env)
    assert str(settings.origins["memory_dirs"]) == "env:MEMSTAGED_MEMORY_DIRS"
    assert settings.values()["memory_dirs"] == ["/a", "/b"]


def test_metrics_file_is_off_by_default_and_set_by_the_file_or_the_environment(
    tmp_path: Path,
) -> None:
    """Issue 21 item 7: `metrics_file` is off unless set; the variable wins over the file, `~`
    is expanded (as for log_file: the process's home), each origin is kept for `config show`,
    a reload says it changed, and a NUL in it is refused naming the key."""
    env = {"HOME": str(tmp_path)}
    off = config.load(config=_write(tmp_path, "memory_dirs = []\n"), env=env)
    assert str(off.origins["metrics_file"]) == "default"
    assert off.metrics_file is None
    assert off.values()["metrics_file"] == ""
    cfg = _write(tmp_path, 'memory_dirs = []\nmetrics_file = "~/m/memstaged.prom"\n')
    from_file = config.load(config=cfg, env=env)
    wanted = Path.home() / "m" / "memstaged.prom"  # the test's own home (conftest)
    assert from_file.metrics_file == wanted
    assert str(from_file.origins["metrics_file"]) == f"file:{cfg}"
    assert from_file.changed_from(off) == {"metrics_file": ["", str(wanted)]}
    from_env = config.load(config=cfg, env={**env, "MEMSTAGED_METRICS_FILE": "/run/x.prom"})
    assert from_env.metrics_file == Path("/run/x.prom")
    assert str(from_env.origins["metrics_file"]) == "env:MEMSTAGED_METRICS_FILE"
    with pytest.raises(ConfigError, match="key 'metrics_file': a path cannot hold a NUL byte"):
        config.load(config=_write(tmp_path, 'metrics_file = "a\\u0000b"\n'), env=env)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MEMSTAGED_SETTLE", "soon", "must be a number of seconds from 0 to 604800 (--settle)"),
        ("MEMSTAGED_SETTLE", "inf", "must be a number of seconds from 0 to 604800 (--settle)"),
        ("MEMSTAGED_SPLIT_INVALID_CANDIDATES", "maybe", "must be true or false"),
    ],
)
def test_a_bad_variable_is_said_in_words_too(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    """Issue 31 item 11: `MEMSTAGED_SETTLE=soon` says what it must be, not `expected a
    float`."""
    with pytest.raises(ConfigError) as err:
        config.load(env={name: value, "HOME": str(tmp_path)}, memory_dirs=["m"])
    assert str(err.value).startswith(f"{name}={value!r}: {message}")
