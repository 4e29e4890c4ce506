"""The real-systemd harness (tests/support/systemd_env.py) does what the memstaged tests rely on.

A tiny ``Type=notify`` service (a Python script using ``systemd.daemon.notify`` and
``systemd.journal.send``, run with this interpreter) goes through start, reload, watchdog
and stop under a real ``systemd --user`` manager, logging into a real journald.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import systemd_env
from support.systemd_env import UserSystemd
from support.waiting import wait_until

pytestmark = pytest.mark.systemd

UNIT = "sdenv-probe.service"
MESSAGE_ID = "1c2e4b7a9d3f4e0b8a6c5d7e9f0a1b2c"

# The service under test. argv[1] is a directory through which the test releases it from
# the two states it must be observed in (reloading, stopping by itself).
SERVICE = r"""
import os, signal, sys, time
from pathlib import Path
from systemd import daemon, journal

control = Path(sys.argv[1])
pending = set()
for signum, name in ((signal.SIGHUP, "reload"), (signal.SIGTERM, "stop"),
                     (signal.SIGUSR1, "mute-watchdog"), (signal.SIGUSR2, "stop-by-itself")):
    signal.signal(signum, lambda _s, _f, name=name: pending.add(name))

def released(name):
    path = control / name
    while not path.exists():
        time.sleep(0.01)
    path.unlink()

print("hello on stdout", flush=True)
journal.send("quarantined bad.json", PRIORITY=4, MESSAGE_ID="@MESSAGE_ID@",
             MEMSTAGED_DECISION="quarantined", MEMSTAGED_FILE="bad.json")
journal.send("bad.json is valid", PRIORITY=6, MEMSTAGED_DECISION="valid")
daemon.notify("READY=1\nSTATUS=ready, reloads=0")
ping_every = int(os.environ["WATCHDOG_USEC"]) / 4e6
last_ping = 0.0
reloads = 0
while True:
    if "reload" in pending:
        pending.discard("reload")
        daemon.notify("RELOADING=1\nSTATUS=reloading")
        released("reload")
        reloads += 1
        journal.send(f"reloaded ({reloads})", MEMSTAGED_EVENT="reloaded")
        daemon.notify(f"READY=1\nSTATUS=ready, reloads={reloads}")
    if "stop" in pending:
        daemon.notify("STOPPING=1\nSTATUS=stopping")
        journal.send("stopping on SIGTERM", MEMSTAGED_EVENT="stopping")
        sys.exit(0)
    if "stop-by-itself" in pending:
        daemon.notify("STOPPING=1\nSTATUS=stopping by itself")
        released("exit")
        sys.exit(0)
    if "mute-watchdog" not in pending and time.monotonic() - last_ping >= ping_every:
        daemon.notify("WATCHDOG=1")
        last_ping = time.monotonic()
    time.sleep(0.01)
""".replace("@MESSAGE_ID@", MESSAGE_ID)


def unit_text(script: Path, control: Path, watchdog_sec: int = 5) -> str:
    return f"""\
[Unit]
Description=systemd_env probe service

[Service]
Type=notify
ExecStart={sys.executable} {script} {control}
ExecReload=/bin/kill -HUP $MAINPID
WatchdogSec={watchdog_sec}
Restart=on-failure
RestartSec=100ms
"""


@pytest.fixture
def sd() -> Iterator[UserSystemd]:
    reason = systemd_env.unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot run a systemd --user manager here: {reason}")
    pytest.importorskip("systemd.daemon", reason="systemd-python is not installed")
    with systemd_env.user_systemd() as running:
        yield running


@pytest.fixture
def control(tmp_path: Path) -> Path:
    (tmp_path / "control").mkdir()
    return tmp_path / "control"


@pytest.fixture
def probe(sd: UserSystemd, tmp_path: Path, control: Path) -> str:
    """Install the probe unit (WatchdogSec=5) and start it."""
    script = tmp_path / "probe.py"
    script.write_text(SERVICE, encoding="utf-8")
    sd.install_unit(UNIT, unit_text(script, control))
    sd.systemctl("start", UNIT, check=True)
    return UNIT


def start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None if it is gone or a zombie): PIDs wrap around on
    a busy machine, so "is it still running" compares (pid, start time), not the pid alone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def journal_records(sd: UserSystemd, *matches: str) -> list[dict[str, str]]:
    out = sd.journalctl("--user-unit", UNIT, *matches, "-o", "json", check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_start_reports_ready_and_status(sd: UserSystemd, probe: str) -> None:
    """``systemctl --user start`` of a Type=notify unit returns once READY=1 arrived, and the
    service's STATUS= text is what ``show -p StatusText`` reports: sd_notify reaches the
    manager."""
    assert sd.systemctl("is-active", probe).stdout.strip() == "active"
    shown = sd.show(probe, "ActiveState", "SubState", "StatusText", "Type", "WatchdogUSec")
    assert shown == {
        "ActiveState": "active",
        "SubState": "running",
        "StatusText": "ready, reloads=0",
        "Type": "notify",
        "WatchdogUSec": "5s",
    }
    assert sd.manager_pid != int(sd.show(probe, "MainPID")["MainPID"]) > 0


def test_journal_fields_found_by_field_match(sd: UserSystemd, probe: str) -> None:
    """Records sent with ``systemd.journal.send`` land in the real journald with their custom
    fields and with ``_SYSTEMD_USER_UNIT`` set, so ``journalctl --user-unit UNIT FIELD=value``
    and ``systemd.journal.Reader`` on the journal directory both find exactly them; the
    service's stdout reaches the journal too."""
    from systemd import journal

    wait_until(
        lambda: len(journal_records(sd, "MEMSTAGED_DECISION=quarantined")) == 1,
        timeout=10,
        what="the quarantined record in the journal",
    )
    [record] = journal_records(sd, "MEMSTAGED_DECISION=quarantined")
    assert record["MESSAGE"] == "quarantined bad.json"
    assert record["PRIORITY"] == "4"
    assert record["MESSAGE_ID"] == MESSAGE_ID
    assert record["MEMSTAGED_FILE"] == "bad.json"
    assert record["_SYSTEMD_USER_UNIT"] == probe
    assert record["_TRANSPORT"] == "journal"
    # Two field matches on different fields are ANDed.
    assert journal_records(sd, "MEMSTAGED_DECISION=valid", f"MESSAGE_ID={MESSAGE_ID}") == []
    wait_until(
        lambda: bool(journal_records(sd, "_TRANSPORT=stdout")),
        timeout=10,
        what="the service's stdout line in the journal",
    )
    assert journal_records(sd, "_TRANSPORT=stdout")[0]["MESSAGE"] == "hello on stdout"

    reader = journal.Reader(path=str(sd.journal_dir))
    try:
        reader.add_match(_SYSTEMD_USER_UNIT=probe, MEMSTAGED_DECISION="quarantined")
        entries = list(reader)
    finally:
        reader.close()
    assert [e["MESSAGE"] for e in entries] == ["quarantined bad.json"]
    assert entries[0]["PRIORITY"] == 4  # the Reader converts known fields
    assert str(entries[0]["MESSAGE_ID"]).replace("-", "") == MESSAGE_ID


def test_journalctl_user_flag_finds_nothing_for_root_on_systemd_252(
    sd: UserSystemd, probe: str
) -> None:
    """Documents why the harness says ``--user-unit``: systemd 252's ``journalctl --user -u``
    only opens user-<uid>.journal files, and root's records are in system.journal. If this
    starts failing, systemd is >= 254 and ``--user -u`` works too."""
    wait_until(
        lambda: bool(journal_records(sd, "MEMSTAGED_DECISION=quarantined")),
        timeout=10,
        what="the quarantined record",
    )
    version = int(sd.run("systemctl", "--version").stdout.split()[1])
    user_flag = sd.journalctl("--user", "-u", probe, "MEMSTAGED_DECISION=quarantined", "-o", "json")
    if version < 254 and os.geteuid() == 0:
        assert user_flag.stdout == ""
    else:
        assert "quarantined bad.json" in user_flag.stdout


def test_reload_sends_sighup_and_waits_for_ready(
    sd: UserSystemd, probe: str, control: Path
) -> None:
    """``systemctl --user reload`` runs ExecReload (``kill -HUP $MAINPID``); the service's
    RELOADING=1 puts the unit into ``reloading`` and its READY=1 brings it back, same PID.
    (systemd 252 lets ``systemctl reload`` return as soon as ``kill`` exits, so the test runs
    it in the background and watches the unit's state instead.)"""
    pid = sd.show(probe, "MainPID")["MainPID"]
    reload = subprocess.Popen(sd.command("systemctl", "--user", "reload", probe), env=sd.env)
    try:
        wait_until(
            lambda: (
                sd.show(probe, "ActiveState", "StatusText")
                == {"ActiveState": "reloading", "StatusText": "reloading"}
            ),
            timeout=10,
            what="RELOADING=1 to reach the manager",
        )
        (control / "reload").touch()
        assert reload.wait(timeout=30) == 0
    finally:
        if reload.poll() is None:
            reload.kill()
            reload.wait()
    wait_until(
        lambda: (
            sd.show(probe, "ActiveState", "StatusText")
            == {"ActiveState": "active", "StatusText": "ready, reloads=1"}
        ),
        timeout=10,
        what="READY=1 after the reload",
    )
    assert sd.show(probe, "MainPID", "NRestarts") == {"MainPID": pid, "NRestarts": "0"}
    wait_until(
        lambda: bool(journal_records(sd, "MEMSTAGED_EVENT=reloaded")),
        timeout=10,
        what="the reloaded record",
    )


def test_watchdog_pings_arrive_and_a_silent_service_is_restarted(
    sd: UserSystemd, tmp_path: Path, control: Path
) -> None:
    """WATCHDOG=1 reaches the manager (its WatchdogTimestamp advances); when the service stops
    pinging, the manager kills it after WatchdogSec=1 and Restart=on-failure starts it anew."""
    script = tmp_path / "probe.py"
    script.write_text(SERVICE, encoding="utf-8")
    sd.install_unit(UNIT, unit_text(script, control, watchdog_sec=1))
    sd.systemctl("start", UNIT, check=True)
    first = sd.show(UNIT, "MainPID", "WatchdogTimestampMonotonic")
    wait_until(
        lambda: (
            sd.show(UNIT, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]
            != first["WatchdogTimestampMonotonic"]
        ),
        timeout=5,
        what="a WATCHDOG=1 ping to reach the manager",
    )

    sd.systemctl("kill", "--kill-who=main", "--signal=SIGUSR1", UNIT, check=True)
    wait_until(
        lambda: sd.show(UNIT, "NRestarts")["NRestarts"] == "1",
        timeout=10,
        what="the watchdog to restart the service",
    )
    wait_until(
        lambda: sd.systemctl("is-active", UNIT).stdout.strip() == "active",
        timeout=10,
        what="the restarted service to be ready",
    )
    assert sd.show(UNIT, "MainPID")["MainPID"] != first["MainPID"]
    messages = sd.journalctl("--user-unit", UNIT, "-o", "cat").stdout
    assert "Watchdog timeout" in messages
    assert "Failed with result 'watchdog'" in messages


def test_stopping_notification_and_stop(sd: UserSystemd, probe: str, control: Path) -> None:
    """A service that sends STOPPING=1 on its own is seen ``deactivating`` until it exits; and
    ``systemctl --user stop`` (SIGTERM -> STOPPING=1 -> exit 0) ends ``inactive`` with result
    ``success`` and the service's last record in the journal."""
    sd.systemctl("kill", "--kill-who=main", "--signal=SIGUSR2", probe, check=True)
    wait_until(
        lambda: (
            sd.show(probe, "ActiveState", "StatusText")
            == {"ActiveState": "deactivating", "StatusText": "stopping by itself"}
        ),
        timeout=10,
        what="STOPPING=1 to reach the manager",
    )
    (control / "exit").touch()
    wait_until(
        lambda: sd.systemctl("is-active", probe).stdout.strip() == "inactive",
        timeout=10,
        what="the service to exit",
    )
    assert sd.show(probe, "Result", "NRestarts") == {"Result": "success", "NRestarts": "0"}

    sd.systemctl("start", probe, check=True)
    sd.systemctl("stop", probe, check=True)
    assert sd.systemctl("is-active", probe).stdout.strip() == "inactive"
    assert sd.show(probe, "Result")["Result"] == "success"
    wait_until(
        lambda: bool(journal_records(sd, "MEMSTAGED_EVENT=stopping")),
        timeout=10,
        what="the stopping record",
    )


def test_teardown_leaves_nothing_behind(tmp_path: Path) -> None:
    """After the context manager exits, journald, the manager and the probe are gone, the
    cgroup and temp dir are removed, and the host's /run/systemd was never touched (the
    namespace's /run/systemd/system is not the host's: on a host without systemd it would make
    apt's maintainer scripts call systemctl)."""
    reason = systemd_env.unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot run a systemd --user manager here: {reason}")
    pytest.importorskip("systemd.daemon", reason="systemd-python is not installed")
    host_run = Path("/run/systemd")
    before = sorted(p.name for p in host_run.iterdir()) if host_run.exists() else []
    script = tmp_path / "probe.py"
    script.write_text(SERVICE, encoding="utf-8")
    with systemd_env.user_systemd() as sd:
        sd.install_unit(UNIT, unit_text(script, tmp_path))
        sd.systemctl("start", UNIT, check=True)
        pids = [sd.journald_pid, sd.manager_pid, int(sd.show(UNIT, "MainPID")["MainPID"])]
        started = [start_time(pid) for pid in pids]
        assert None not in started
        assert (sd.base / "run" / "system").is_dir()  # what sd_booted() sees inside
        assert sorted(p.name for p in host_run.iterdir()) == before
    wait_until(
        lambda: all(start_time(p) != t for p, t in zip(pids, started, strict=True)),
        timeout=10,
        what="journald, the manager and the service to be gone",
    )
    assert not sd.cgroup.parent.exists()
    assert not sd.base.exists()
    assert (sorted(p.name for p in host_run.iterdir()) if host_run.exists() else []) == before


def test_teardown_kills_and_reports_leftovers() -> None:
    """A process that outlives the manager (KillMode=none) is found in the cgroup, killed, and
    reported as LeftoverProcessesError: the no-leftovers check is real."""
    reason = systemd_env.unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot run a systemd --user manager here: {reason}")
    with (
        pytest.raises(systemd_env.LeftoverProcessesError, match="sleep 300"),
        systemd_env.user_systemd() as sd,
    ):
        sd.install_unit("stray.service", "[Service]\nExecStart=sleep 300\nKillMode=none\n")
        sd.systemctl("start", "stray.service", check=True)
        stray = int(sd.show("stray.service", "MainPID")["MainPID"])
        started = start_time(stray)
        assert started is not None
    # Killed by the teardown; reaped by whichever ancestor inherited it, maybe a moment later.
    wait_until(lambda: start_time(stray) != started, timeout=10, what="the stray to be gone")
    assert not sd.cgroup.parent.exists()


def test_unprivileged_manager_runs_as_that_user_without_capabilities() -> None:
    """`user_systemd(uid=N)` is a normal user's manager, as user@N.service would be (issue 13,
    the unit: the hardening is probed under it): the manager and its services run as N with no
    capabilities, they can use the delegated cgroup and runtime dir, and teardown still leaves
    nothing behind."""
    reason = systemd_env.unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot run a systemd --user manager here: {reason}")
    uid = systemd_env.unprivileged_uid()
    if uid is None:
        pytest.skip("no unprivileged user (nobody) or no setpriv here")
    with systemd_env.user_systemd(uid=uid) as sd:
        out = sd.home / "status"
        sd.install_unit(
            "who.service",
            f"[Service]\nType=oneshot\nExecStart=/bin/sh -c 'cat /proc/self/status > {out}'\n",
        )
        sd.systemctl("start", "who.service", check=True)
        service = dict(line.split(":", 1) for line in out.read_text().splitlines())
        manager = Path(f"/proc/{sd.manager_pid}/status").read_text()
        assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in manager.splitlines()
        assert service["Uid"].split() == [str(uid)] * 4
        assert service["CapEff"].strip() == service["CapPrm"].strip() == "0000000000000000"
        assert out.stat().st_uid == uid
    assert not sd.cgroup.parent.exists()
    assert not sd.base.exists()
