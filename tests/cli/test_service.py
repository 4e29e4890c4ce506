"""systemd integration without systemd: sd_notify messages, the unit text and its sandbox, and the
journald sink against a stand-in ``sendv``.

``memstaged service`` against a stand-in ``systemctl`` is in
``tests/system/test_service_install.py``; the same things against a real user manager and a real
journald are in ``tests/system/test_systemd_service.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from memstaged.cli import systemd_unit
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
