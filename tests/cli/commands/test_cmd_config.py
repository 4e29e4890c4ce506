"""``memstaged config check`` and ``memstaged config show`` (issue 21 item 9), run as a user
runs them: ``cli.main`` with a real config file, real ``MEMSTAGED_*`` variables and options."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.commands import json_lines, one_line_error, run

from memstaged import config

pytestmark = pytest.mark.usefixtures("plain_output")


def _config_file(home: Path, text: str) -> Path:
    path = home / "config" / "memstaged" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_config_check_is_ok_or_one_line_naming_the_key(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 9: `config check` exits 0 for a config that loads, and 2 with one line
    naming the file and the key (a typo gets its likely meaning) for one that does not, the
    default file, `--config FILE` and a bad MEMSTAGED_* variable alike."""
    default = _config_file(home, 'memory_dirs = ["~/src/*/.pi/memory/project"]\nsettle = 1\n')
    assert run(capsys, "config", "check") == (0, f"{default}: ok\n", "")

    typo = home / "typo.toml"
    typo.write_text("settel = 2\n")
    code, out, err = run(capsys, "config", "check", "--config", str(typo))
    assert (code, out) == (2, "")
    assert one_line_error(err) == (
        f"memstaged: {typo}: unknown key 'settel' (did you mean 'settle'?)"
    )

    wrong = home / "wrong.toml"
    wrong.write_text("observer = 'fast'\n")
    code, _out, err = run(capsys, "--config", str(wrong), "config", "check")
    assert code == 2
    assert one_line_error(err).startswith(f"memstaged: {wrong}: key 'observer': ")

    monkeypatch.setenv("MEMSTAGED_SETTLE", "soon")
    code, _out, err = run(capsys, "config", "check")
    assert code == 2
    assert one_line_error(err) == (
        "memstaged: MEMSTAGED_SETTLE='soon': must be a number of seconds from 0 to 604800 "
        "(--settle)"
    )


def test_config_show_gives_each_value_and_where_it_came_from(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 item 9: one line a setting, `origin<TAB>key=value` as `git config --show-origin`
    prints them: an option beats the variable, which beats the file, which beats the default;
    `--json` says the same as one object a setting."""
    path = _config_file(
        home,
        'memory_dirs = ["~/src/*/.pi/memory/project"]\nsettle = 3.0\nobserver = "inotify"\n'
        "split_invalid_candidates = true\n",
    )
    monkeypatch.setenv("MEMSTAGED_OBSERVER", "polling")
    monkeypatch.setenv("MEMSTAGED_SETTLE", "4")
    code, out, err = run(capsys, "config", "show", "--settle", "5")
    assert (code, err) == (0, "")
    state = home / "state" / "memstaged" / "decisions.jsonl"
    assert out.splitlines() == [
        "default\tconfig=" + f'"{path}"',
        f'file:{path}\tmemory_dirs=["~/src/*/.pi/memory/project"]',
        "default\tproject_roots={}",
        "option:--settle\tsettle=5.0",
        "default\tmax_file_size=8388608",
        "default\tmax_quarantine_copy=1073741824",
        f"file:{path}\tsplit_invalid_candidates=true",
        "default\trescan_interval=300.0",
        "env:MEMSTAGED_OBSERVER\tobserver=" + '"polling"',
        f'default\tlog_file="{state}"',
        "default\tlog_max_bytes=10485760",
        "default\tlog_backups=5",
        'default\tmetrics_file=""',
        'default\tmetrics_file_mode="0600"',
    ]

    mdir = home / "p" / ".pi" / "memory" / "project"
    monkeypatch.setenv("MEMSTAGED_CONFIG", str(path))
    code, out, _err = run(
        capsys, "config", "show", "--json", "--memory-dir", str(mdir), "--project-root", "/srv/p"
    )
    assert code == 0
    shown = {row["key"]: row for row in json_lines(out)}
    assert shown["config"] == {
        "key": "config",
        "value": str(path),
        "origin": "env",
        "source": "MEMSTAGED_CONFIG",
    }
    assert shown["memory_dirs"] == {
        "key": "memory_dirs",
        "value": [str(mdir)],
        "origin": "option",
        "source": "--memory-dir",
    }
    assert shown["project_roots"]["value"] == {str(mdir): "/srv/p"}
    assert (shown["settle"]["value"], shown["settle"]["source"]) == (4.0, "MEMSTAGED_SETTLE")
    assert (shown["max_file_size"]["value"], shown["max_file_size"]["origin"]) == (
        8388608,
        "default",
    )
    assert list(shown) == [
        "config",
        "memory_dirs",
        "project_roots",
        "settle",
        "max_file_size",
        "max_quarantine_copy",
        "split_invalid_candidates",
        "rescan_interval",
        "observer",
        "log_file",
        "log_max_bytes",
        "log_backups",
        "metrics_file",
        "metrics_file_mode",
    ]


def test_config_show_without_a_config_file_says_where_it_would_be(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21 item 9: with no config file every setting is `default`, and the first line
    says which file was looked for."""
    code, out, _err = run(capsys, "config", "show")
    assert code == 0
    lines = out.splitlines()
    expected = home / "config" / "memstaged" / "config.toml"
    assert lines[0] == f"default\tconfig=none ({expected} does not exist)"
    assert all(line.startswith("default\t") for line in lines)


def test_config_show_and_check_cover_metrics_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 21 item 7: `config show` lists metrics_file with its origin; `config check`
    refuses a wrong type for it naming the key."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('metrics_file = "/var/lib/node_exporter/memstaged.prom"\n')
    code, out, _ = run(capsys, "config", "show", "--config", str(cfg))
    assert code == 0
    assert f'file:{cfg}\tmetrics_file="/var/lib/node_exporter/memstaged.prom"' in out.splitlines()
    cfg.write_text("metrics_file = 5\n")
    code, _, err = run(capsys, "config", "check", "--config", str(cfg))
    assert code == 2
    assert "key 'metrics_file'" in one_line_error(err)
    assert config.load(config=None, env={"HOME": str(tmp_path)}).metrics_file is None
