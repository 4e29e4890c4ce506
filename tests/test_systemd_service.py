"""memstaged as a real systemd user service, under a real ``systemd --user`` and a real journald.

``tests/systemd_env.py`` starts both privately for each test (see docs/systemd-testing.md); on a
machine where that is impossible (not root, no systemd, no cgroup2) these tests are skipped with
the reason. The service is installed with ``memstaged service install`` from this checkout's
``.venv``, exactly as a user would.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import staging_doc
from systemd_env import UserSystemd, unavailable_reason, user_systemd, wait_until

from memstaged import log

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.systemd,
    pytest.mark.skipif(REASON is not None, reason=f"no private systemd here: {REASON}"),
]

UNIT = "memstaged.service"
ROOT = Path(__file__).resolve().parents[1]
MEMSTAGED = Path(sys.executable).parent / "memstaged"


def _journal(sd: UserSystemd, *matches: str) -> list[dict[str, Any]]:
    out = sd.journalctl(f"--user-unit={UNIT}", "-o", "json", *matches, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _wait_journal(sd: UserSystemd, *matches: str, count: int = 1) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        found[:] = _journal(sd, *matches)
        return len(found) >= count

    wait_until(enough, timeout=20, what=f"{count} journal entries matching {matches}")
    return found


def _config(sd: UserSystemd, *memory_dirs: Path, broken: bool = False) -> Path:
    path = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    dirs = ", ".join(json.dumps(str(m)) for m in memory_dirs)
    path.write_text("memory_dirs = [" if broken else f"memory_dirs = [{dirs}]\nsettle = 0.5\n")
    return path


def _memory_dir(root: Path) -> Path:
    mdir = root / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    return mdir


def _proc_status(pid: str) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def test_user_service_installs_runs_logs_to_journal_reloads_and_stops(tmp_path: Path) -> None:
    """`memstaged service install --enable` in a real user manager: the unit verifies, the
    service becomes active (READY=1 after the start-up scan), decisions are found in the
    journal by field, STATUS= shows counts, a reload adds a memory dir, a bad reload keeps it
    running, stop exits cleanly, and uninstall removes it with no process left behind."""
    project = tmp_path / "project"
    mdir = _memory_dir(project)
    (mdir / "staging" / "before.json").write_text(json.dumps(staging_doc(project, "before")))
    broken = mdir / "staging" / "broken-before.json"
    broken.write_bytes(b"{nope")
    os.utime(broken, (time.time() - 60, time.time() - 60))  # long finished, not being written
    with user_systemd() as sd:
        _config(sd, mdir)
        installed = sd.run(str(MEMSTAGED), "service", "install", "--enable")
        assert installed.returncode == 0, installed.stderr
        unit = sd.unit_dir / UNIT
        assert f"ExecStart={MEMSTAGED}" in unit.read_text().splitlines()
        verify = sd.run("systemd-analyze", "--user", "verify", str(unit))
        assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
        assert sd.systemctl("is-active", UNIT).stdout.strip() == "active"
        assert sd.systemctl("is-enabled", UNIT).stdout.strip() == "enabled"

        # The start-up scan decided both files before READY=1 made the service active.
        props = sd.show(UNIT, "MainPID", "WatchdogUSec", "StatusText", "NRestarts")
        assert props["WatchdogUSec"] == "30s"
        assert "2 decided, 1 quarantined" in props["StatusText"]
        pid = props["MainPID"]
        quarantined = _journal(sd, "MEMSTAGED_DECISION=quarantined")
        assert [Path(e["MEMSTAGED_PATH"]).name for e in quarantined] == ["broken-before.json"]

        # New files, decided as they arrive, each a journal entry with fields.
        (mdir / "staging" / "new.json").write_text(json.dumps(staging_doc(project, "new-one")))
        (mdir / "staging" / "bad.json").write_bytes(b'{"schemaVersion": 2}')
        entry = _wait_journal(sd, "MEMSTAGED_DECISION=quarantined", count=2)[-1]
        assert entry["MEMSTAGED_PATH"] == str(mdir / "staging" / "bad.json")
        assert entry["MESSAGE"].startswith(f"quarantined {mdir}/staging/bad.json: ")
        assert entry["PRIORITY"] == "4"
        assert entry["MESSAGE_ID"] == log.MESSAGE_IDS["decision"]
        assert entry["SYSLOG_IDENTIFIER"] == "memstaged"
        assert json.loads(entry["MEMSTAGED_DEADLETTER"])  # the files written, as JSON
        valid = _wait_journal(sd, "MEMSTAGED_SESSION_ID=new-one")[-1]
        assert (valid["MEMSTAGED_DECISION"], valid["PRIORITY"]) == ("valid", "6")
        assert not (mdir / "staging" / "bad.json").exists()

        # Reload with a second memory dir: picked up without a restart.
        other_project = tmp_path / "other"
        other = _memory_dir(other_project)
        (other / "staging" / "o.json").write_text(json.dumps(staging_doc(other_project, "o")))
        _config(sd, mdir, other)
        sd.systemctl("reload", UNIT, check=True)
        _wait_journal(sd, "MEMSTAGED_SESSION_ID=o")
        assert _wait_journal(sd, f"MESSAGE_ID={log.MESSAGE_IDS['reload']}")[0]["MEMSTAGED_OK"] == (
            "true"
        )

        # Reload with a broken config: refused, logged as an error, still running.
        _config(sd, broken=True)
        sd.systemctl("reload", UNIT, check=True)
        refused = _wait_journal(sd, "MEMSTAGED_EVENT=reload", "MEMSTAGED_OK=false")[0]
        assert refused["PRIORITY"] == "3"
        assert "not valid TOML" in refused["MEMSTAGED_ERROR"]
        (other / "staging" / "after.json").write_text(json.dumps(staging_doc(other_project, "a")))
        _wait_journal(sd, "MEMSTAGED_SESSION_ID=a")
        assert sd.show(UNIT, "MainPID", "ActiveState") == {"MainPID": pid, "ActiveState": "active"}

        # Stop: SIGTERM, exit 0, nothing restarted.
        sd.systemctl("stop", UNIT, check=True)
        after = sd.show(UNIT, "ActiveState", "Result", "ExecMainStatus", "NRestarts", "MainPID")
        assert after == {
            "ActiveState": "inactive",
            "Result": "success",
            "ExecMainStatus": "0",
            "NRestarts": "0",
            "MainPID": "0",
        }
        assert _journal(sd, "MEMSTAGED_EVENT=stop")

        removed = sd.run(str(MEMSTAGED), "service", "uninstall")
        assert removed.returncode == 0, removed.stderr
        assert not unit.exists()
        assert sd.systemctl("cat", UNIT).returncode != 0


def test_install_enable_without_memory_dirs_leaves_no_failed_unit(tmp_path: Path) -> None:
    """Issue 13 (README item 1), in a real user manager: `service install --enable` with no
    config writes the unit but neither enables nor starts it, says so and what to run in one
    line (exit 1), and leaves no failed unit; after the user writes memory_dirs, the command it
    named starts the service."""
    with user_systemd() as sd:
        installed = sd.run(str(MEMSTAGED), "service", "install", "--enable")
        assert installed.returncode == 1, installed.stderr
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        assert installed.stderr.splitlines() == [
            f"memstaged: not enabled or started: no memory dir is configured in {config}; "
            'write memory_dirs = ["~/src/*/.pi/memory/project"] (your projects) there, '
            "then run: systemctl --user enable --now memstaged"
        ]
        assert (sd.unit_dir / UNIT).is_file()
        assert sd.systemctl("is-enabled", UNIT).stdout.strip() == "disabled"
        state = sd.show(UNIT, "ActiveState", "NRestarts", "LoadState")
        assert state == {"ActiveState": "inactive", "NRestarts": "0", "LoadState": "loaded"}
        failed = sd.systemctl("list-units", "--failed", "--plain", "--no-legend")
        assert failed.stdout.strip() == ""

        _config(sd, _memory_dir(tmp_path / "project"))
        sd.systemctl("enable", "--now", "memstaged", check=True)
        assert sd.systemctl("is-active", UNIT).stdout.strip() == "active"
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0


def test_config_error_fails_the_unit_once_without_a_restart_loop() -> None:
    """Started by hand with no memory dir configured, the service exits 2; the unit is failed
    with status 2 and not restarted (RestartPreventExitStatus), and the journal says why."""
    with user_systemd() as sd:
        assert sd.run(str(MEMSTAGED), "service", "install").returncode == 0
        started = sd.systemctl("start", UNIT)
        assert started.returncode != 0
        assert started.stderr.startswith(f"Job for {UNIT} failed")
        state = sd.show(UNIT, "ActiveState", "ExecMainStatus", "NRestarts")
        assert state == {"ActiveState": "failed", "ExecMainStatus": "2", "NRestarts": "0"}
        reasons = [e["MESSAGE"] for e in _journal(sd, "SYSLOG_IDENTIFIER=memstaged")]
        assert any(m.startswith("memstaged: no memory dir") for m in reasons), reasons
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0


# -- the hardening options, one by one -------------------------------------------------------

#: Options of the packaged unit that shape behaviour (checked by the test above).
BEHAVIOUR = {
    "Type",
    "NotifyAccess",
    "ExecStart",
    "ExecReload",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "WatchdogSec",
    "TimeoutStopSec",
    "SyslogIdentifier",
}
#: Hardening options, each with the probe result that shows the user manager enforces it.
HARDENING = {
    "UMask": ("umask", "0o77"),
    "NoNewPrivileges": ("NoNewPrivs", "1"),
    "SystemCallArchitectures": ("Seccomp", "2"),  # a seccomp filter is loaded; no 32-bit probe
    "RestrictAddressFamilies": ("AF_INET", "EAFNOSUPPORT"),
    "RestrictNamespaces": ("unshare", "EPERM"),
    "RestrictRealtime": ("SCHED_FIFO", "EPERM"),
    "RestrictSUIDSGID": ("chmod u+s", "EPERM"),
    "LockPersonality": ("personality", "EPERM"),
    "MemoryDenyWriteExecute": ("mmap wx", "EPERM"),
    "SystemCallFilter": ("umount2", "EPERM"),
    "SystemCallErrorNumber": ("umount2", "EPERM"),  # EPERM, not a SIGSYS kill
}

PROBE = textwrap.dedent(
    """\
    import ctypes, errno, json, mmap, os, socket, sys
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "allowed"
        except OSError as err:
            out[name] = errno.errorcode.get(err.errno, str(err.errno))
    def c(result):
        if result != 0:
            raise OSError(ctypes.get_errno(), "")
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    out["NoNewPrivs"] = status["NoNewPrivs"].strip()
    out["Seccomp"] = status["Seccomp"].strip()
    mask = os.umask(0); os.umask(mask); out["umask"] = oct(mask)
    attempt("AF_INET", lambda: socket.socket(socket.AF_INET).close())
    attempt("AF_UNIX", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close())
    attempt("unshare", lambda: c(libc.unshare(0x04000000)))  # CLONE_NEWUTS
    attempt("SCHED_FIFO", lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
    suid = sys.argv[1] + ".suid"; open(suid, "w").close()
    attempt("chmod u+s", lambda: os.chmod(suid, 0o4755))
    attempt("personality", lambda: c(0 if libc.personality(0x0008) != -1 else 1))
    attempt("mmap wx", lambda: mmap.mmap(-1, 4096, prot=7))  # READ|WRITE|EXEC
    attempt("umount2", lambda: c(libc.umount2(b"/nonexistent-memstaged-probe", 0)))
    json.dump(out, open(sys.argv[1], "w"))
    """
)


def _service_section(text: str) -> list[tuple[str, str]]:
    section, options = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            options.append((key, value))
    return options


def test_every_hardening_option_of_the_unit_is_enforced_by_the_user_manager(
    tmp_path: Path,
) -> None:
    """Each hardening line of the packaged unit, run by the real user manager, really blocks
    what it promises (no option that a user manager silently ignores); the same process is
    allowed what memstaged needs (AF_UNIX for sd_notify and journald)."""
    options = _service_section((ROOT / "packaging" / "systemd" / "memstaged.service").read_text())
    keys = {key for key, _ in options}
    assert keys == BEHAVIOUR | set(HARDENING), "a new unit option needs a probe here"
    hardening = "\n".join(f"{k}={v}" for k, v in options if k in HARDENING)
    probe, result = tmp_path / "probe.py", tmp_path / "probe.json"
    probe.write_text(PROBE)
    with user_systemd() as sd:
        sd.install_unit(
            "probe.service",
            f"[Service]\nType=oneshot\nExecStart={sys.executable} {probe} {result}\n{hardening}\n",
        )
        sd.systemctl("start", "probe.service", check=True)
        baseline = tmp_path / "baseline.json"
        sd.install_unit(
            "baseline.service",
            f"[Service]\nType=oneshot\nExecStart={sys.executable} {probe} {baseline}\n",
        )
        sd.systemctl("start", "baseline.service", check=True)
    got = json.loads(result.read_text())
    unhardened = json.loads(baseline.read_text())
    assert got["AF_UNIX"] == "allowed"
    for option, (probe_name, expected) in HARDENING.items():
        assert got[probe_name] == expected, option
        assert unhardened[probe_name] != expected, f"{option}: the probe proves nothing"
