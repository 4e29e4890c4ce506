"""systemd integration without systemd: sd_notify messages, the unit text, ``memstaged service``
against a stand-in ``systemctl``, and the journald sink against a stand-in ``sendv``.

The same things against a real user manager and a real journald are in
``test_systemd_service.py``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from memstaged.cli import systemd_unit
from memstaged.cli.main import main
from memstaged.cli.systemd_unit import Notifier
from memstaged.log import writer
from memstaged.log.format import MESSAGE_IDS

ROOT = Path(__file__).resolve().parents[2]


# -- sd_notify ----------------------------------------------------------------------------------


def test_notifier_sends_the_sd_notify_protocol() -> None:
    """READY/STATUS, RELOADING (with MONOTONIC_USEC), STOPPING, WATCHDOG and EXTEND_TIMEOUT are
    sent as systemd expects them, one datagram each."""
    sent: list[str] = []
    notifier = Notifier(environ={"NOTIFY_SOCKET": "/run/x"}, send=sent.append)
    notifier.ready("watching 1 memory dirs")
    notifier.reloading()
    notifier.stopping()
    notifier.ping()
    notifier.extend_timeout(60)
    assert sent[0] == "READY=1\nSTATUS=watching 1 memory dirs"
    assert re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=\d+\nSTATUS=reloading configuration", sent[1])
    assert sent[2:] == ["STOPPING=1\nSTATUS=stopping", "WATCHDOG=1", "EXTEND_TIMEOUT_USEC=60000000"]


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 7.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 7.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval_is_a_quarter_of_watchdog_usec(
    env: dict[str, str], interval: float | None
) -> None:
    """Pings every WATCHDOG_USEC/4 (issue 19 item 5: no gap over a third of it, work included),
    and only when the watchdog is meant for this process."""
    notifier = Notifier(environ={"NOTIFY_SOCKET": "/run/x", **env}, send=lambda _t: None)
    assert notifier.watchdog_interval == interval


def test_notifier_is_silent_outside_systemd() -> None:
    """Without NOTIFY_SOCKET nothing is sent (the daemon runs the same in a terminal)."""
    notifier = Notifier(environ={})
    assert notifier.enabled is False
    notifier.ready("x")  # no socket, no error


# -- the unit ----------------------------------------------------------------------------------


def test_packaged_unit_copies_are_identical() -> None:
    """packaging/systemd/memstaged.service is the unit `memstaged service install` writes."""
    packaged = (ROOT / "packaging" / "systemd" / "memstaged.service").read_text()
    assert packaged == (ROOT / "memstaged" / "data" / "memstaged.service").read_text()


@pytest.mark.parametrize(
    ("path", "word"),
    [
        ("/home/ana/.local/bin/memstaged", "/home/ana/.local/bin/memstaged"),
        ("/opt/my tools/memstaged", '"/opt/my tools/memstaged"'),
        ("/opt/100%/memstaged", "/opt/100%%/memstaged"),
        ("/opt/$HOME/memstaged", "/opt/$$HOME/memstaged"),
        ('/opt/a"b\\c/memstaged', '"/opt/a\\"b\\\\c/memstaged"'),
    ],
)
def test_exec_start_path_is_escaped_for_systemd(path: str, word: str) -> None:
    """An install path with spaces, %, $, quotes or backslashes still names the same file in
    ExecStart= (systemd would otherwise expand specifiers and variables, or split the word)."""
    assert systemd_unit.exec_quote(path) == word


def test_unit_text_points_execstart_at_the_executable() -> None:
    """Only ExecStart= and ExecReload= change (both run this installation's memstaged, the
    reload its config check, issue 21 item 8); every other line of the packaged unit stays."""
    text = systemd_unit.unit_text("/venv/bin/memstaged")
    template = (ROOT / "packaging" / "systemd" / "memstaged.service").read_text().splitlines()
    lines = text.splitlines()
    execs = ("ExecStart=", "ExecReload=")
    assert [line for line in lines if line.startswith(execs)] == [
        "ExecStart=/venv/bin/memstaged",
        "ExecReload=/venv/bin/memstaged config check --reload $MAINPID",
    ]
    assert [ln for ln in lines if not ln.startswith(execs)] == [
        ln for ln in template if not ln.startswith(execs)
    ]


# -- memstaged service install/uninstall against a stand-in systemctl ----------------------------


@pytest.fixture
def fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `systemctl` on PATH that records its arguments, and fails when FAIL_ON matches."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    script = bin_dir / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(calls))}\n'
        'case "$*" in *"$FAIL_ON"*) if [ -n "$FAIL_ON" ]; then '
        'echo "Failed to $FAIL_ON: Unit memstaged.service has a bad setting." >&2; exit 1; fi;; '
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("FAIL_ON", raising=False)
    return calls


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_service_install_writes_the_unit_and_reloads(
    fake_systemctl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`memstaged service install` writes the unit under $XDG_CONFIG_HOME/systemd/user with the
    absolute path of this installation's memstaged, and runs daemon-reload; nothing else."""
    assert main(["service", "install"]) == 0
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    exec_start = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    executable = exec_start[0].removeprefix("ExecStart=")
    assert os.path.isabs(executable) and os.access(executable, os.X_OK)
    assert Path(executable).name == "memstaged"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert _calls(fake_systemctl) == [
        "--user --no-ask-password show-environment",
        "--user --no-ask-password daemon-reload",
    ]
    assert "then run: systemctl --user enable --now memstaged" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config_text", "reason"),
    [
        (None, "no memory dir is configured in {config}"),
        ("settle = 1\n", "no memory dir is configured in {config}"),
        ("memory_dirs = [\n", "{config}: not valid TOML: "),
        ("memory_dir = []\n", "{config}: unknown key 'memory_dir'"),
    ],
)
def test_service_install_enable_without_memory_dirs_starts_nothing(
    fake_systemctl: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_text: str | None,
    reason: str,
) -> None:
    """Issue 13 (README item 1): `install --enable` with no config, a config without
    memory_dirs, or a bad config writes the unit but neither enables nor starts it (the service
    would exit 2 at once and stay failed); it says why and what to run in one line, exit 1."""
    if config_text is not None:
        _configure(tmp_path, config_text)
    config = tmp_path / "config" / "memstaged" / "config.toml"
    assert main(["service", "install", "--enable"]) == 1
    assert (tmp_path / "config" / "systemd" / "user" / "memstaged.service").is_file()
    assert not any(" enable " in c or "start" in c for c in _calls(fake_systemctl))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("memstaged: not enabled or started: " + reason.format(config=config))
    assert err[0].endswith("then run: systemctl --user enable --now memstaged")


def test_service_install_reads_the_config_the_service_will_read(
    fake_systemctl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 (README item 1): the check uses the user manager's environment (HOME,
    XDG_CONFIG_HOME as `systemctl --user show-environment` gives them), not this shell's, and
    the service's working directory (the home directory) for the default ./.pi/memory/project."""
    home = tmp_path / "service-home"
    (home / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    env_file = tmp_path / "manager.env"
    env_file.write_text(f"HOME={home}\nXDG_CONFIG_HOME={tmp_path / 'nowhere'}\n")
    script = Path(shutil.which("systemctl") or "")
    script.write_text(
        script.read_text().replace(
            "case", f'[ "$2 $3" = "--no-ask-password show-environment" ] && cat {env_file}\ncase', 1
        )
    )
    assert main(["service", "install", "--enable"]) == 0  # ~/.pi/memory/project of the service
    assert "--user --no-ask-password start memstaged.service" in _calls(fake_systemctl)


def _configure(
    tmp_path: Path, text: str = 'memory_dirs = ["~/src/*/.pi/memory/project"]\n'
) -> None:
    path = tmp_path / "config" / "memstaged" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_service_install_enable_starts_it_and_uninstall_undoes_it(
    fake_systemctl: Path, tmp_path: Path
) -> None:
    """--enable also enables and starts the unit when memory dirs are configured (a glob
    that matches nothing yet is fine: the daemon waits for it); uninstall stops, disables,
    removes the file and reloads."""
    _configure(tmp_path)
    assert main(["service", "install", "--enable"]) == 0
    assert _calls(fake_systemctl)[2:] == [
        "--user --no-ask-password enable memstaged.service",
        "--user --no-ask-password start memstaged.service",
    ]
    fake_systemctl.unlink()
    assert main(["service", "uninstall"]) == 0
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    assert not unit.exists()
    calls = _calls(fake_systemctl)
    assert calls[0] == "--user --no-ask-password disable --now memstaged.service"
    assert "--user --no-ask-password daemon-reload" in calls


def test_service_install_failure_is_one_line_and_exit_2(
    fake_systemctl: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A systemctl failure ends as one line naming the command, exit code 2, no traceback."""
    _configure(Path(os.environ["XDG_CONFIG_HOME"]).parent)
    monkeypatch.setenv("FAIL_ON", "start")
    assert main(["service", "install", "--enable"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "memstaged: systemctl --user start memstaged.service: "
        "Failed to start: Unit memstaged.service has a bad setting."
    ]


def test_service_without_systemctl_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a machine without systemctl, install fails with one clear line."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert main(["service", "install"]) == 2
    assert "systemctl is not installed" in capsys.readouterr().err


# -- the journald sink -----------------------------------------------------------------------------


def _sent_fields(lines: tuple[bytes, ...]) -> dict[bytes, bytes]:
    return {name: value for name, _, value in (line.partition(b"=") for line in lines)}


def test_journal_handler_sends_every_field_and_keeps_undecodable_path_bytes(
    tmp_path: Path,
) -> None:
    """Each event field becomes a MEMSTAGED_* journal field; a path that is not UTF-8 keeps its
    original bytes; an unknown session id gives no field rather than the text "null"."""
    sent: list[tuple[bytes, ...]] = []
    writer.configure(None, console="off", journal="off")
    writer.add_sink(writer.JournalSink(send=lambda *lines: sent.append(lines)))
    path = os.fsdecode(b"/p/staging/caf\xe9.json")
    writer.get_logger().warning("decision", decision="quarantined", path=path, session_id=None)
    fields = _sent_fields(sent[0])
    assert fields[b"MEMSTAGED_PATH"] == b"/p/staging/caf\xe9.json"
    assert fields[b"MEMSTAGED_DECISION"] == b"quarantined"
    assert fields[b"PRIORITY"] == b"4"
    assert fields[b"MESSAGE_ID"] == MESSAGE_IDS["decision"].encode()
    assert fields[b"SYSLOG_IDENTIFIER"] == b"memstaged"
    assert b"MEMSTAGED_SESSION_ID" not in fields


def test_journal_failure_falls_back_to_stderr_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """When journald cannot be reached the event still reaches stderr as one JSON line, and
    logging does not raise into the caller."""

    def broken(*_lines: bytes) -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    writer.configure(None, console="off", journal="off")
    writer.add_sink(writer.JournalSink(send=broken))
    writer.get_logger().info("decision", decision="valid", path="a.json")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert json.loads(err[0])["decision"] == "valid"


_LOG_CALL = re.compile(r"\.(?:debug|info|warning|error|critical)\(\s*\"([a-z_]+)\"")


def test_every_event_kind_has_its_own_message_id() -> None:
    """`journalctl MESSAGE_ID=...` finds one kind of event: each event name memstaged logs has
    a MESSAGE_ID of its own."""
    names: set[str] = set()
    for source in (ROOT / "memstaged").rglob("*.py"):
        names |= set(_LOG_CALL.findall(source.read_text()))
    assert {"decision", "start", "ready", "reload", "stop", "rescan"} <= names
    missing = sorted(n for n in names if n not in MESSAGE_IDS)
    assert missing == []
    ids: list[Any] = list(MESSAGE_IDS.values())
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


def test_sandbox_writable_trees_follow_the_config(tmp_path: Path) -> None:
    """Issue 13 (the unit): `install --sandbox` leaves writable each memory-dir pattern's
    literal prefix (a glob's directory before its first wildcard; a dir that does not exist yet
    its nearest existing parent, so that it is writable once created; a relative pattern under
    the home directory, the service's working directory), the state dir and the log's dir."""
    home, src = tmp_path / "home", tmp_path / "home" / "src"
    src.mkdir(parents=True)
    (tmp_path / "srv").mkdir()
    config = tmp_path / "config" / "memstaged" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        'memory_dirs = ["~/src/*/.pi/memory/project", '
        f'"{tmp_path}/srv/not-yet/.pi/memory/project", "work/p/.pi/memory/project"]\n'
        f'log_file = "{tmp_path}/logs/decisions.jsonl"\n'
    )
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }
    assert systemd_unit.writable_trees(env) == sorted(
        [
            str(src),
            str(tmp_path / "srv"),
            str(home),
            str(tmp_path / "logs"),
            str(home / ".local" / "state" / "memstaged"),
        ]
    )


def test_sandbox_leaves_the_control_socket_and_the_metrics_file_writable(
    tmp_path: Path,
) -> None:
    """Issue 21 items 6 and 7: under `install --sandbox` (ProtectSystem=strict: /run is
    read-only) the daemon must still make its control socket under $XDG_RUNTIME_DIR and write
    its metrics file: both directories are among the writable trees."""
    home = tmp_path / "home"
    home.mkdir()
    config = tmp_path / "config" / "memstaged" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'memory_dirs = ["{home}/p/.pi/memory/project"]\n'
        f'log_file = "{home}/decisions.jsonl"\n'
        f'metrics_file = "{tmp_path}/textfile/memstaged.prom"\n'
    )
    env = {
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_RUNTIME_DIR": "/run/user/1000",
    }
    trees = systemd_unit.writable_trees(env)
    assert "/run/user/1000" in trees
    assert str(tmp_path / "textfile") in trees


def test_sandbox_drop_in_quotes_paths_for_systemd() -> None:
    """A tree with a space, %, a quote or a backslash is one ReadWritePaths= word naming that
    directory ("-": skipped, not fatal, if it is gone at start)."""
    text = systemd_unit.sandbox_text(["/a b/100%", '/q"\\'])
    assert text.splitlines()[-1] == 'ReadWritePaths="-/a b/100%%" "-/q\\"\\\\"'
    assert "PrivateUsers=yes" in text.splitlines()


def test_service_install_sandbox_refused_when_the_manager_cannot_run_it(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13 (the unit): where the check unit fails (user namespaces off, ...), --sandbox
    says so in one line, exit 2, writes no drop-in, enables nothing, and removes the check
    unit."""
    _configure(tmp_path)
    monkeypatch.setenv("FAIL_ON", "start memstaged-sandbox-check")
    assert main(["service", "install", "--enable", "--sandbox"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("memstaged: the sandbox cannot run in this user manager")
    units = tmp_path / "config" / "systemd" / "user"
    assert not (units / "memstaged.service.d").exists()
    assert not (units / "memstaged-sandbox-check.service").exists()
    assert not any(" enable " in c for c in _calls(fake_systemctl))


# -- upgrades and uninstalls (issue 22 item 9) -------------------------------------------------


def _active_systemctl(fake_systemctl: Path) -> None:
    """The stand-in systemctl answers ``is-active`` with 0: the service runs."""
    script = Path(shutil.which("systemctl") or "")
    assert script.parent == fake_systemctl.parent / "bin"
    text = script.read_text().replace(
        "case", '[ "$3" = "is-active" ] && exit 0\n[ "$3" = "show-environment" ] && exit 0\ncase', 1
    )
    script.write_text(text)


def test_service_install_says_what_changed_and_restarts_only_when_asked(
    fake_systemctl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22 item 9: `service install --enable` over a unit that ran another installation's
    memstaged (pipx's) says the old and the new ExecStart, and does not restart the running
    service: it says how; `--restart` restarts it."""
    _configure(tmp_path)
    _active_systemctl(fake_systemctl)
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    old = "/home/ana/.local/pipx/venvs/memstaged/bin/memstaged"
    unit.parent.mkdir(parents=True)
    unit.write_text(systemd_unit.unit_text(old))
    assert main(["service", "install", "--enable"]) == 0
    new = systemd_unit.installed_executable()
    out = capsys.readouterr().out.splitlines()
    assert out[1:6] == [
        "changed ExecStart:",
        f"  - ExecStart={old}",
        f"  + ExecStart={new}",
        "changed ExecReload:",
        f"  - ExecReload={old} config check --reload $MAINPID",
    ]
    assert (
        "memstaged.service is running as it was installed before; to run the unit just "
        "written: systemctl --user restart memstaged (or service install --restart)"
    ) in out
    calls = _calls(fake_systemctl)
    assert not any("restart" in c for c in calls)
    assert "--user --no-ask-password start memstaged.service" in calls  # a no-op when running

    fake_systemctl.unlink()
    assert main(["service", "install", "--restart"]) == 0  # unchanged now: nothing to say
    out = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("changed ") for line in out)
    assert "restarted memstaged.service" in out
    assert "--user --no-ask-password restart memstaged.service" in _calls(fake_systemctl)


def test_service_uninstall_lists_what_stays_and_purge_keeps_the_memory_dirs(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 22 item 9: `service uninstall` lists what it leaves (the config, the state, each
    memory dir's deadletter/); `--purge` removes memstaged's own config and state and nothing
    of a memory dir: its staging/ and deadletter/ keep every byte."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("MEMSTAGED_CONFIG", raising=False)
    monkeypatch.delenv("MEMSTAGED_MEMORY_DIRS", raising=False)
    monkeypatch.delenv("MEMSTAGED_LOG_FILE", raising=False)
    mdir = home / "src" / "app" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    (mdir / "staging" / "s.json").write_bytes(b"[]")
    (mdir / "deadletter" / "originals").mkdir(parents=True)
    (mdir / "deadletter" / "r.json").write_bytes(b'{"record": 1}')
    _configure(tmp_path, 'memory_dirs = ["~/src/*/.pi/memory/project"]\n')
    config_dir = tmp_path / "config" / "memstaged"
    state = home / ".local" / "state" / "memstaged"
    state.mkdir(parents=True)
    (state / "decisions.jsonl").write_text("{}\n")
    before = {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()}

    assert main(["service", "uninstall"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "kept (--purge removes them):",
        f"  {config_dir}  (config)",
        f"  {state}  (state (the decision log, the seen cache))",
        "kept, never removed by uninstall (quarantined files: recover or purge them with "
        "memstaged deadletter before uninstalling):",
        f"  {mdir / 'deadletter'}",
    ]
    assert config_dir.is_dir() and state.is_dir()

    assert main(["service", "uninstall", "--purge"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [f"removed {config_dir}", f"removed {state}"]
    assert f"  {mdir / 'deadletter'}" in out
    assert not config_dir.exists() and not state.exists()
    assert {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()} == before
