"""A typo in the config does not stop the commands that only look (issue 31 item 10).

The config file is the one a running daemon was started with: a key mistyped in it since must
not take ``status``, ``log``, ``stats`` and ``deadletter list`` away from the operator who
wants to see what the daemon is doing, as ``postqueue -p`` works with a typo in main.cf. They
leave the key out, say so on stderr in one line naming the file and the key, and go on; what
changes files (``--once``, ``deadletter recover``) and ``config check`` stay strict: exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.commands import json_lines, one_line_error, prepare, run

pytestmark = pytest.mark.usefixtures("plain_output")


def _typo(tmp_path: Path, memory_dir: Path) -> tuple[Path, list[str]]:
    """The default config file (XDG_CONFIG_HOME, set by the log_file fixture) with the memory
    dir, an unknown key and a bad value; the two warning lines the lenient commands print."""
    cfg = tmp_path / "config" / "memstaged" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'memory_dirs = [{json.dumps(str(memory_dir))}]\nsettel = 5\nsettle = "2s"\n')
    warnings = [
        f"memstaged: warning: {cfg}: unknown key 'settel' (did you mean 'settle'?); left out",
        f"memstaged: warning: {cfg}: key 'settle': must be a number of seconds from 0 to "
        '604800, not "2s"; left out, its default used',
    ]
    return cfg, warnings


def test_inspection_commands_work_with_a_typo_and_warn_once(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 31 item 10: with an unknown key and a bad value in the config, `status`, `log`,
    `stats`, `deadletter list` and `deadletter show` still read the memory dir the config names
    and the log, print what they printed before, and say each problem once on stderr (`log`
    resolves its settings twice); `status` exits 1 with nothing else to flag: the config needs
    care (the daemon's next reload or restart would refuse it), said among what needs
    attention (with --json, on stderr)."""
    prepare(project, memory_dir, log_file)
    acked = run(capsys, "deadletter", "ack", "--all", "--memory-dir", str(memory_dir))
    assert acked[0] == 0  # ack is strict: before the typo
    _cfg, warnings = _typo(tmp_path, memory_dir)

    code, out, err = run(capsys, "status")  # the warnings are among what needs attention
    assert (code, err) == (1, "")
    assert out.splitlines()[-2:] == [
        w.replace("memstaged: warning: ", "needs attention: config ") for w in warnings
    ]
    assert "dead-letter records" in out
    code, out, err = run(capsys, "status", "--json")  # --json: on stderr
    assert (code, err.splitlines()) == (1, warnings)
    assert json_lines(out)[0]["attention"] == []

    code, out, err = run(capsys, "log", "--json", "--decision", "quarantined", "--no-pager")
    assert (code, err.splitlines()) == (0, warnings)
    assert len(json_lines(out)) == 2

    code, out, err = run(capsys, "stats", "--json")
    assert (code, err.splitlines()) == (0, warnings)
    assert json_lines(out)[0]["decisions"]["quarantined"] == 2

    code, out, err = run(capsys, "deadletter", "list", "--json", "--no-pager")
    assert (code, err.splitlines()) == (0, warnings)
    records = json_lines(out)
    assert len(records) == 5

    code, out, err = run(capsys, "deadletter", "show", records[0]["id"], "--no-pager")
    assert (code, err.splitlines()) == (0, warnings)
    assert records[0]["id"] in out


def test_what_changes_files_and_config_check_stay_strict(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 31 item 10: the same config is refused, one line naming the file and the first
    bad key, exit 2, by `--once`, `deadletter recover` and `config check`: none of them acts
    on settings other than the ones written."""
    prepare(project, memory_dir, log_file)
    cfg, _ = _typo(tmp_path, memory_dir)
    refused = f"memstaged: {cfg}: unknown key 'settel' (did you mean 'settle'?)"
    for argv in (["--once"], ["deadletter", "recover", "--all", "--dry-run"], ["config", "check"]):
        code, _out, err = run(capsys, *argv)
        assert (code, one_line_error(err)) == (2, refused), argv


def test_the_check_reports_a_typo_as_a_warning_on_its_own_output(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 31 item 10: `status --check` says the keys left out as a WARNING (exit 1) in its
    own output, a short first line and one line per key after it, and nothing on stderr (a
    monitor reads stdout). `--no-require-daemon`: the user manager is not asked (no process
    is started here)."""
    cfg, _ = _typo(tmp_path, memory_dir)
    code, out, err = run(capsys, "status", "--check", "--no-require-daemon")
    assert (code, err) == (1, "")
    first, *detail = out.splitlines()
    assert first.startswith(
        "MEMSTAGED WARNING - 2 config keys left out (memstaged config check) | memory_dirs=1;"
    )
    assert detail == [
        f"config {cfg}: unknown key 'settel' (did you mean 'settle'?); left out",
        f"config {cfg}: key 'settle': must be a number of seconds from 0 to 604800, not "
        '"2s"; left out, its default used',
    ]
