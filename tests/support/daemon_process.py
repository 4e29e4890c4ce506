"""A real ``memstaged`` daemon in a subprocess (``python -m memstaged``), and its decision log
read back as it grows: waits are "until this is in the log, at most N seconds", never a sleep.

Also: many projects under one glob of memory dirs, and the config naming them.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from support.decision_log import DecisionLog
from support.helpers import carried_out
from support.waiting import wait_until

FINAL = {"valid", "repaired", "quarantined", "foreign", "skipped"}
#: The guard of every wait for an event (seconds). Only a failure guard: a wait returns as soon
#: as its event is logged; it is generous because a daemon's start alone takes seconds on a
#: 2-core machine that runs other work beside the tests (issue 19 item 8).
WAIT = 60.0


class DaemonProcess:
    """One ``memstaged`` daemon in a subprocess, and its decision log."""

    def __init__(
        self,
        tmp_path: Path,
        *args: str,
        name: str = "daemon",
        nofile: tuple[int, int] | None = None,
        env: dict[str, str] | None = None,
        log_file: Path | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        """``log_file``: the decision log elsewhere (on a file system a test fills);
        ``prefix``: a command the daemon runs under (``setpriv``, to obey file permissions)."""
        extra_env = env or {}
        self.log_file = log_file or tmp_path / f"{name}.jsonl"
        #: Its ``XDG_STATE_HOME`` (the seen cache, the instance locks).
        self.state_home = tmp_path / "xdg-state"
        self.stderr_file = tmp_path / f"{name}.stderr"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID", "WATCHDOG_USEC")
            and not k.startswith("MEMSTAGED_")
        }
        env.update(
            MEMSTAGED_LOG_FILE=str(self.log_file),
            XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
            XDG_STATE_HOME=str(self.state_home),
        )
        env.update(extra_env)

        def limit_descriptors() -> None:  # in the child, before exec: as a service manager would
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with self.stderr_file.open("wb") as err:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "memstaged", *args],
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                preexec_fn=limit_descriptors if nofile is not None else None,  # noqa: PLW1509
            )
        self._log = DecisionLog(self.log_file)

    def events(self) -> list[dict[str, Any]]:
        """Every event logged so far (read incrementally, across rotations of the log: a
        decision of 120,000 reasons is a line of megabytes, and a test not scheduled for a
        while on a busy machine may find the log rotated more than once since its last read:
        issue 19 item 8)."""
        return self._log.update()

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], what: str, timeout: float = WAIT
    ) -> list[dict[str, Any]]:
        """Wait until ``predicate`` holds of the events logged; returns them. The daemon exiting
        first ends the wait at once."""
        wait_until(lambda: predicate(self.events()), what, timeout=timeout, alive=self.proc)
        return self.events()

    def wait_ready(self, timeout: float = WAIT) -> None:
        self.wait_for(lambda ev: any(e["event"] == "ready" for e in ev), "ready", timeout)

    def decisions(self, name: str) -> list[str]:
        return [
            e["decision"]
            for e in self.events()
            if e["event"] == "decision" and Path(e["path"]).name == name
        ]

    def wait_decided(self, *names: str, timeout: float = WAIT) -> dict[str, dict[str, Any]]:
        """Wait until each file has a final decision, carried out; returns the last event of each.

        A decision is logged before its change (SPEC 5): until the change is made, a quarantined
        or repaired file still holds the bytes the event names.
        """
        wanted = set(names)

        def final(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
            last = {}
            for e in events:
                if e["event"] == "decision" and e["decision"] in FINAL:
                    name = Path(e["path"]).name
                    if name in wanted:
                        last[name] = e
            return last

        def done(events: list[dict[str, Any]]) -> bool:
            last = final(events)
            return len(last) == len(wanted) and all(carried_out(e) for e in last.values())

        self.wait_for(done, f"{len(wanted)} decisions", timeout)
        return final(self.events())

    def wait_decided_version(self, name: str, data: bytes, timeout: float = WAIT) -> dict[str, Any]:
        """Wait for the final decision of this version of ``name`` (the one whose bytes are
        ``data``), carried out; returns its event.

        Not the file's latest decision: a repair is followed by the daemon's look at its own
        rewrite (``valid``, SPEC 1), and a loaded machine may log that before the test reads
        (issue 19 item 8).
        """
        digest = hashlib.sha256(data).hexdigest()

        def mine(events: list[dict[str, Any]]) -> dict[str, Any] | None:
            for e in events:
                if (
                    e["event"] == "decision"
                    and e["decision"] in FINAL
                    and e.get("sha256") == digest
                    and Path(e["path"]).name == name
                ):
                    return e
            return None

        def done(events: list[dict[str, Any]]) -> bool:
            event = mine(events)
            return event is not None and carried_out(event)

        self.wait_for(done, f"the decision of {name} ({digest[:12]})", timeout)
        event = mine(self.events())
        assert event is not None
        return event

    def stop(self, sig: int = signal.SIGTERM, timeout: float = WAIT) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def many_projects(src: Path, count: int) -> list[Path]:
    mdirs = []
    for i in range(count):
        mdir = src / f"p{i:04}" / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        mdirs.append(mdir)
    return mdirs


def glob_config(tmp_path: Path, src: Path) -> Path:
    conf = tmp_path / "config.toml"
    pattern = json.dumps(str(src / "*" / ".pi" / "memory" / "project"))
    conf.write_text(f"memory_dirs = [{pattern}]\nsettle = 0.5\nrescan_interval = 3600\n")
    return conf
