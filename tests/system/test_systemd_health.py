"""The health check and the metrics file under the real service (issue 21 items 6 and 7).

``tests/system/test_health.py`` runs the daemon as a plain subprocess; here it runs as a user would
run it: ``memstaged service install --enable`` (with and without ``--sandbox``) under a real
``systemd --user`` and a real journald (``tests/support/systemd_env.py``), over a copy of the demo's
memory dir (``examples/memory-dir``). What the hardened unit might block is what a monitor needs:
the control socket under ``$XDG_RUNTIME_DIR/memstaged/`` (``status --check``), the ``touch``
``deadletter ack`` sends over it, and the metrics file (``metrics_file``), written from inside the
unit's sandbox and read outside it. A bad config failing the reload is tested in
``tests/system/test_systemd_service.py``.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.documents import staging_doc
from support.metrics import samples
from support.systemd_env import UserSystemd, unavailable_reason, user_systemd
from support.waiting import wait_until

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.systemd,
    pytest.mark.skipif(REASON is not None, reason=f"no private systemd here: {REASON}"),
]

UNIT = "memstaged.service"
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "memory-dir"
MEMSTAGED = Path(sys.executable).parent / "memstaged"
#: What the demo's eight files come to (``make demo``; tests/system/test_decision_counts.py).
DEMO_DECISIONS = {
    "valid": 1,
    "repaired": 3,
    "quarantined": 3,
    "foreign": 1,
    "skipped": 0,
}
OK = "MEMSTAGED OK - 1 memory dir, nothing needs attention"


def _demo(tmp_path: Path) -> tuple[Path, Path]:
    """The demo's memory dir where ``make demo`` puts it (its files name ``../example-project``)."""
    project = tmp_path / "example-project"
    mdir = project / ".pi" / "memory" / "project"
    shutil.copytree(DEMO, mdir)
    return project, mdir


def _decisions(path: Path) -> dict[str, float]:
    found = samples(path) if path.exists() else {}
    return {d: found.get(f"memstaged_decisions_total{{decision={d}}}", -1) for d in DEMO_DECISIONS}


def _check(sd: UserSystemd, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``memstaged status --check``, run as the manager's user (with ``env`` instead of the
    manager's): its exit code and its text (the first line without the performance data,
    then the lines after it, if any). No ``--require-daemon``: with the unit enabled, the
    check requires the daemon by itself."""
    done = subprocess.run(
        sd.command(str(MEMSTAGED), "status", "--check", *args),
        env=sd.env if env is None else env,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    first, *detail = done.stdout.splitlines() or [""]
    assert first.startswith("MEMSTAGED ") and done.stderr == "", (done.stdout, done.stderr)
    return done.returncode, "\n".join([first.partition(" | ")[0], *detail])


def _journal(sd: UserSystemd, match: str) -> list[dict[str, Any]]:
    out = sd.journalctl(f"--user-unit={UNIT}", "-o", "json", match, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _process_state(pid: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return ""


@pytest.mark.parametrize("sandbox", [False, True], ids=["plain", "sandbox"])
def test_status_check_ack_and_metrics_work_under_the_real_service(
    tmp_path: Path, sandbox: bool
) -> None:
    """Issue 21 items 6 and 7 under the real service (plain unit, and with the --sandbox
    drop-in; no --require-daemon: the enabled unit requires the daemon, issue 31 item 1): on
    the demo's data `status --check` asks the daemon over its control socket and
    warns (exit 1) for the unseen dead letters; `deadletter ack --all` makes it OK (exit 0) and
    the metrics file follows; the metrics file is written from inside the unit (its
    `metrics_file_mode`, 0644, under the unit's UMask=0077, issue 31 item 2; parsed by
    prometheus_client) with the demo's decisions and follows a new file; with the daemon
    SIGSTOPped the check is CRITICAL (exit 2) naming the daemon that does not answer, and OK
    again after SIGCONT. A check run without XDG_RUNTIME_DIR (cron, NRPE) finds the daemon too,
    and the journal has no control_failed or metrics_failed."""
    project, mdir = _demo(tmp_path)
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    with user_systemd() as sd:
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(
            f"memory_dirs = [{json.dumps(str(mdir))}]\n"
            f"metrics_file = {json.dumps(str(prom))}\n"
            'metrics_file_mode = "0644"\n'
            "settle = 0.5\n"
        )
        install = [str(MEMSTAGED), "service", "install", "--enable"]
        installed = sd.run(*install, *(["--sandbox"] if sandbox else []))
        assert installed.returncode == 0, installed.stderr
        props = sd.show(UNIT, "ActiveState", "MainPID", "ProtectSystem")
        assert props["ActiveState"] == "active"  # READY=1 came: enable --now waits for it
        assert props["ProtectSystem"] == ("strict" if sandbox else "no")
        pid = props["MainPID"]

        # The demo decided; its quarantines left dead-letter records nobody has seen yet.
        wait_until(
            lambda: _decisions(prom) == DEMO_DECISIONS,
            timeout=20,
            what=f"the demo's decisions in {prom}",
        )
        assert stat.S_IMODE(prom.stat().st_mode) == 0o644
        found = samples(prom)
        assert found["memstaged_deadletter_unseen_records"] == 5
        assert found["memstaged_memory_dirs_watched"] == 1
        assert found["memstaged_log_write_failing"] == 0
        assert not list(prom.parent.glob(".*.tmp"))
        sock = Path(sd.env["XDG_RUNTIME_DIR"]) / "memstaged" / f"daemon-{pid}.sock"
        assert stat.S_ISSOCK(sock.lstat().st_mode)
        code, text = _check(sd)
        assert (code, text) == (
            1,
            "MEMSTAGED WARNING - 5 dead-letter records not yet seen (memstaged deadletter "
            "list, then deadletter ack)",
        )

        # A monitor run from cron or NRPE has no XDG_RUNTIME_DIR: /run/user/<uid> is found.
        cron = {k: v for k, v in sd.env.items() if k != "XDG_RUNTIME_DIR"}
        assert _check(sd, env=cron) == (1, text)

        acked = sd.run(str(MEMSTAGED), "deadletter", "ack", "--all")
        assert acked.returncode == 0, acked.stderr
        assert _check(sd) == (0, OK)
        wait_until(  # ack told the daemon over the socket: the file is written again
            lambda: samples(prom)["memstaged_deadletter_unseen_records"] == 0,
            timeout=20,
            what="the unseen count to be 0 in the metrics file after ack",
        )

        (mdir / "staging" / "new.json").write_text(json.dumps(staging_doc(project, "new")))
        wait_until(
            lambda: _decisions(prom)["valid"] == DEMO_DECISIONS["valid"] + 1,
            timeout=20,
            what="the new file's decision in the metrics file",
        )

        sd.systemctl("kill", "-s", "SIGSTOP", UNIT, check=True)
        try:
            wait_until(lambda: _process_state(pid) == "T", timeout=10, what="the daemon stopped")
            code, text = _check(sd, "--timeout", "2")
            assert code == 2, text
            assert text.startswith("MEMSTAGED CRITICAL - ")
            assert f"memstaged daemon (pid {pid}) does not answer" in text
        finally:
            sd.systemctl("kill", "-s", "SIGCONT", UNIT, check=True)
        assert _check(sd) == (0, OK)
        assert sd.show(UNIT, "MainPID", "NRestarts") == {"MainPID": pid, "NRestarts": "0"}

        assert len(_journal(sd, "MEMSTAGED_DECISION=quarantined")) == 3  # the demo's, in journald
        for event in ("control_failed", "metrics_failed"):  # nothing refused by the unit
            assert _journal(sd, f"MEMSTAGED_EVENT={event}") == []

        sd.systemctl("stop", UNIT, check=True)
        assert not sock.exists()  # removed at a clean stop, from inside the sandbox too
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0


def test_a_metrics_file_set_by_a_reload_outside_the_sandbox_is_refused_until_reinstalled(
    tmp_path: Path,
) -> None:
    """Issue 21 item 7 under `service install --sandbox`: the sandbox's writable trees are
    fixed at install, so a `metrics_file` first set by a reload, in a directory outside them,
    cannot be written (EROFS): the daemon says so once in the journal (`metrics_failed`, naming
    the file) and works on; `service install --enable --sandbox --restart` makes that directory
    writable and the file appears."""
    project, mdir = _demo(tmp_path)
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    with user_systemd() as sd:
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f"memory_dirs = [{json.dumps(str(mdir))}]\nsettle = 0.5\n")
        install = [str(MEMSTAGED), "service", "install", "--enable", "--sandbox"]
        installed = sd.run(*install)
        assert installed.returncode == 0, installed.stderr
        assert str(prom.parent) not in installed.stdout

        config.write_text(config.read_text() + f"metrics_file = {json.dumps(str(prom))}\n")
        sd.systemctl("reload", UNIT, check=True)
        (mdir / "staging" / "new.json").write_text(json.dumps(staging_doc(project, "new")))
        wait_until(
            lambda: bool(_journal(sd, "MEMSTAGED_EVENT=metrics_failed")),
            timeout=20,
            what="metrics_failed in the journal",
        )
        failed = _journal(sd, "MEMSTAGED_EVENT=metrics_failed")
        assert [(e["MEMSTAGED_PATH"], e["MEMSTAGED_ERROR"]) for e in failed] == [
            (str(prom), "Read-only file system")
        ]
        assert not prom.exists()
        assert sd.show(UNIT, "ActiveState")["ActiveState"] == "active"

        again = sd.run(*install, "--restart")
        assert again.returncode == 0, again.stderr
        assert str(prom.parent) in again.stdout
        wait_until(prom.exists, timeout=20, what=f"{prom} after the reinstall")
        # The restarted daemon decided nothing anew (issue 31 item 4: its counters start from
        # 0); what the earlier one decided valid, new.json included, is in the seen cache.
        assert samples(prom)["memstaged_seen_files{decision=valid}"] >= 1
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0


def test_check_requires_the_daemon_of_an_enabled_unit_and_says_why_it_is_down(
    tmp_path: Path,
) -> None:
    """Issue 31 item 1, under a real user manager: with memstaged.service enabled and running,
    `status --check` (no --require-daemon) is OK; after `systemctl --user stop` it is CRITICAL
    (exit 2) saying the unit is stopped, from cron (no XDG_RUNTIME_DIR) too; failed (a config
    the restart refuses: exit 2, no restart) it is CRITICAL saying failed, with the config's
    bad key as the detail; `--no-require-daemon` does not ask and is OK. Disabled, it is as
    it was before: no daemon is required (only --once is used), unless --require-daemon."""
    mdir = tmp_path / "example-project" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    with user_systemd() as sd:
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f"memory_dirs = [{json.dumps(str(mdir))}]\n")
        installed = sd.run(str(MEMSTAGED), "service", "install", "--enable")
        assert installed.returncode == 0, installed.stderr
        assert sd.show(UNIT, "ActiveState", "UnitFileState") == {
            "ActiveState": "active",
            "UnitFileState": "enabled",
        }
        assert _check(sd) == (0, OK)

        sd.systemctl("stop", UNIT, check=True)
        stopped = (
            2,
            "MEMSTAGED CRITICAL - memstaged.service is enabled but stopped (inactive): "
            "systemctl --user start memstaged",
        )
        assert _check(sd) == stopped
        cron = {k: v for k, v in sd.env.items() if k != "XDG_RUNTIME_DIR"}
        assert _check(sd, env=cron) == stopped
        assert _check(sd, "--no-require-daemon") == (0, OK)

        config.write_text(config.read_text() + "settel = 1\n")
        sd.systemctl("start", UNIT)  # fails: exit 2, which the unit does not restart
        wait_until(
            lambda: sd.show(UNIT, "ActiveState")["ActiveState"] == "failed",
            timeout=20,
            what="the unit to fail on the bad config",
        )
        assert _check(sd) == (
            2,
            "MEMSTAGED CRITICAL - memstaged.service failed (exit-code): journalctl --user -u "
            "memstaged; 1 config key left out (memstaged config check)\n"
            "memstaged.service failed (exit-code): journalctl --user -u memstaged\n"
            f"config {config}: unknown key 'settel' (did you mean 'settle'?); left out",
        )

        config.write_text(f"memory_dirs = [{json.dumps(str(mdir))}]\n")
        sd.systemctl("reset-failed", UNIT, check=True)
        sd.systemctl("disable", UNIT, check=True)
        assert sd.show(UNIT, "UnitFileState", "ActiveState") == {
            "UnitFileState": "disabled",
            "ActiveState": "inactive",
        }
        assert _check(sd) == (0, OK)  # as before: only --once is used
        assert _check(sd, "--require-daemon") == (
            2,
            f"MEMSTAGED CRITICAL - {mdir}: no memstaged daemon is running on it",
        )
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0
