"""One daemon: a second ``memstaged`` daemon on memory dirs another daemon holds (issue 31 item 6).

Two real daemon processes on the same memory dirs, sharing one decision log and one state dir
(their instance locks), as a user typing ``memstaged`` in a shell beside the service has them;
and the same under a real ``systemd --user`` manager, where the line names the service.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import WAIT, DaemonProcess, glob_config, many_projects
from support.decision_log import read_events
from support.documents import staging_doc
from support.systemd_env import unavailable_reason, user_systemd
from support.waiting import wait_until

LIFECYCLE = ("start", "ready", "reload", "stop")
MEMSTAGED = Path(sys.executable).parent / "memstaged"
SYSTEMD = unavailable_reason()


def _already_running(pid: int) -> re.Pattern[str]:
    """The one line, naming the daemon's service only if it runs as one (a test run from a
    service of its own, a CI runner's, would see that one's name)."""
    return re.compile(rf"memstaged is already running \(pid {pid}(, [^ ,;()]+\.service)?\)\n")


def _lifecycle(events: list[dict[str, Any]]) -> list[tuple[str, object]]:
    return [(e["event"], e.get("pid")) for e in events if e["event"] in LIFECYCLE]


def test_a_second_daemon_on_held_memory_dirs_exits_1_and_logs_nothing(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 31 item 6: with every memory dir (four, through a glob in the config) held by a
    running daemon, a second `memstaged` exits 1 with one line naming the first one's pid,
    instead of idling with `ready: memory_dirs=0`. It adds nothing to the shared log (no
    `memory_dir_busy`, no start or stop of its own) and writes no metrics file over the first
    one's. The first one's own lifecycle events (start, ready, reload, stop) carry its pid."""
    src = tmp_path / "src"
    many_projects(src, 4)
    conf = glob_config(tmp_path, src)
    prom = tmp_path / "memstaged.prom"
    with conf.open("a") as fh:
        fh.write(f"metrics_file = {json.dumps(str(prom))}\n")
    first = spawn("--config", str(conf), name="first")
    first.wait_ready()
    wait_until(prom.exists, timeout=WAIT, what="the first daemon's metrics file")
    written = prom.stat().st_mtime_ns, prom.stat().st_ino

    second = spawn("--config", str(conf), name="second", log_file=first.log_file, ready=False)
    assert second.proc.wait(timeout=WAIT) == 1
    assert _already_running(first.proc.pid).fullmatch(second.stderr_file.read_text())
    assert (prom.stat().st_mtime_ns, prom.stat().st_ino) == written

    first.proc.send_signal(signal.SIGHUP)
    first.wait_for(lambda ev: any(e["event"] == "reload" for e in ev), "the reload")
    assert first.stop() == 0
    events = first.events()
    assert _lifecycle(events) == [(name, first.proc.pid) for name in LIFECYCLE]
    assert not [e for e in events if e["event"] == "memory_dir_busy"]


def test_a_second_daemon_with_a_free_memory_dir_works_on_it(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 31 item 6: when only some memory dirs are held, the second daemon starts as
    before: it says which one is busy (retried on each rescan) and decides files in the free
    one. Its own start, ready and stop carry its own pid, told apart from the first one's in
    the log both write."""
    src = tmp_path / "src"
    held, free = many_projects(src, 2)
    first = spawn("--memory-dir", str(held), name="first")
    first.wait_ready()
    second = spawn("--config", str(glob_config(tmp_path, src)), name="second")
    second.wait_ready()
    (free / "staging" / "new.json").write_text(json.dumps(staging_doc(free.parents[2], "new")))
    assert second.wait_decided("new.json")["new.json"]["decision"] == "valid"
    assert second.stop() == 0
    events = second.events()
    busy = [e for e in events if e["event"] == "memory_dir_busy"]
    assert [(e["memory_dir"], e["action"]) for e in busy] == [(str(held), "retried on each rescan")]
    ready = next(e for e in events if e["event"] == "ready")
    assert ready["memory_dirs"] == 1
    assert _lifecycle(events) == [(name, second.proc.pid) for name in ("start", "ready", "stop")]
    assert first.stop() == 0


@pytest.mark.systemd
@pytest.mark.skipif(SYSTEMD is not None, reason=f"no private systemd here: {SYSTEMD}")
def test_memstaged_typed_beside_the_service_names_the_service(tmp_path: Path) -> None:
    """Issue 31 item 6 under a real user manager: with the service running, `memstaged` typed
    in a shell exits 1 with `memstaged is already running (pid N, memstaged.service)`, N the
    service's main pid, and `--once` names it too; the journal has the service's start and
    ready with that pid, and nothing of the second one."""
    project = tmp_path / "project"
    mdir = project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    with user_systemd() as sd:
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f"memory_dirs = [{json.dumps(str(mdir))}]\n")
        installed = sd.run(str(MEMSTAGED), "service", "install", "--enable")
        assert installed.returncode == 0, installed.stderr
        main_pid = sd.show("memstaged.service", "MainPID")["MainPID"]

        typed = sd.run(str(MEMSTAGED))
        assert (typed.returncode, typed.stdout, typed.stderr) == (
            1,
            "",
            f"memstaged is already running (pid {main_pid}, memstaged.service)\n",
        )
        once = sd.run(str(MEMSTAGED), "--once")
        assert once.returncode == 1
        assert (
            f"the memstaged daemon (pid {main_pid}, memstaged.service) already decides the files "
            f"of {mdir}"
        ) in once.stderr
        starts = sd.journalctl("-o", "json", "MEMSTAGED_EVENT=start").stdout.splitlines()
        assert [json.loads(line)["MEMSTAGED_PID"] for line in starts] == [main_pid]
        log = Path(sd.env["XDG_STATE_HOME"]) / "memstaged" / "decisions.jsonl"
        events = read_events(log)
        assert _lifecycle(events) == [("start", int(main_pid)), ("ready", int(main_pid))]
        assert not [e for e in events if e["event"] == "memory_dir_busy"]
        assert sd.run(str(MEMSTAGED), "service", "uninstall").returncode == 0
