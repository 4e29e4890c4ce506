"""The metrics file as a collector reads it (issue 31 items 2, 4 and 5).

Real daemons (``python -m memstaged``) under ``umask 077``, as the unit runs them, write the
metrics file; another user (``nobody``, through ``setpriv``) reads it or is refused, as
node_exporter's user ``prometheus`` would be, with and without a group ACL set by the real
``setfacl``; the counts of one daemon are read from its ``stop`` event, the ``STATUS=`` lines it
sent to a notification socket and its last metrics file, and a restarted one counts from 0.
The file is parsed by ``prometheus_client``'s own parser (and ``promtool`` where it is installed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import as_nobody
from support.daemon_process import DaemonProcess
from support.documents import staging_doc, write
from support.metrics import samples
from support.notify_socket import NotifySocket
from support.waiting import wait_until

#: What the unit's ``UMask=0077`` does, for a daemon started outside systemd.
UMASK_077 = ("sh", "-c", 'umask 077 && exec "$@"', "sh")
#: The decisions ``memstaged_decisions_total`` has a sample for, 0 or not.
DECISIONS = ("valid", "repaired", "quarantined", "foreign", "skipped")
#: The counts of ``STATUS=watching N memory dirs; D decided, ...``.
STATUS_DECIDED = re.compile(r"; (\d+) decided, ")


def _config(path: Path, memory_dir: Path, prom: Path, mode: str | None = None) -> Path:
    text = (
        f"memory_dirs = [{json.dumps(str(memory_dir))}]\nmetrics_file = {json.dumps(str(prom))}\n"
    )
    if mode is not None:
        text += f'metrics_file_mode = "{mode}"\n'
    path.write_text(text + "settle = 0.5\n")
    return path


def _umask(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    raise AssertionError(f"no Umask: line in /proc/{pid}/status")


def _mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None


def _reload(daemon: DaemonProcess, config: Path, memory_dir: Path, prom: Path, mode: str) -> None:
    """A new ``metrics_file_mode`` by SIGHUP; the reload is logged ok."""
    _config(config, memory_dir, prom, mode)
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(
        lambda ev: any(e["event"] == "reload" and e.get("ok") for e in ev), f"the reload to {mode}"
    )


def _decisions_total(found: dict[str, float]) -> dict[str, float]:
    return {d: found[f"memstaged_decisions_total{{decision={d}}}"] for d in DECISIONS}


# -- the mode on disk, and who can read it --------------------------------------------------------


def test_metrics_file_is_0600_under_umask_077_and_the_configured_mode_after_a_reload(
    tmp_path: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 31 item 2: a daemon whose umask is 077 (the unit's UMask=0077) writes the metrics
    file 0600 by default (SPEC 6, which wins over the issue's 0644); `metrics_file_mode =
    "0640"`, set by a reload, gives 0640 at the next write, whatever the umask; no temp file is
    left beside it."""
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    config = _config(tmp_path / "memstaged.toml", memory_dir, prom)
    daemon = spawn("--config", str(config), prefix=UMASK_077)
    assert _umask(daemon.proc.pid) == "0077"
    wait_until(prom.exists, "the metrics file")
    assert _mode(prom) == 0o600
    _reload(daemon, config, memory_dir, prom, "0640")
    wait_until(lambda: _mode(prom) == 0o640, "the metrics file written 0640")
    assert daemon.stop() == 0
    assert _mode(prom) == 0o640
    assert [p.name for p in prom.parent.iterdir()] == ["memstaged.prom"]


def test_another_user_reads_the_metrics_file_at_0644_and_not_at_0600(
    tmp_path: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 31 item 2: node_exporter runs as its own user. A real other user (`nobody`, no
    supplementary group) reads the metrics file the daemon wrote with `metrics_file_mode =
    "0644"`, and is refused once "0600" (the default) applies ("permission denied",
    node_textfile_scrape_error 1)."""
    as_nobody.ids()
    with as_nobody.workspace("memstaged-metrics-") as shared:
        prom = shared / "memstaged.prom"
        config = _config(tmp_path / "memstaged.toml", memory_dir, prom, "0644")
        daemon = spawn("--config", str(config), prefix=UMASK_077)
        wait_until(prom.exists, "the metrics file")
        assert _mode(prom) == 0o644
        read = as_nobody.run_as_nobody("cat", str(prom))
        assert read.returncode == 0, read.stderr
        assert "memstaged_memory_dirs_watched 1" in read.stdout.splitlines()

        _reload(daemon, config, memory_dir, prom, "0600")
        wait_until(lambda: _mode(prom) == 0o600, "the metrics file written 0600")
        refused = as_nobody.run_as_nobody("cat", str(prom))
        assert refused.returncode == 1
        assert "Permission denied" in refused.stderr
        assert daemon.stop() == 0


def _setfacl(*args: str) -> None:
    """The real ``setfacl``; a skip, with the reason, where the file system has no ACLs."""
    done = subprocess.run(
        ["setfacl", *args], capture_output=True, text=True, timeout=30, check=False
    )
    if "Operation not supported" in done.stderr:
        pytest.skip(f"the file system under /tmp has no POSIX ACLs: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr


def test_a_group_acl_on_the_directory_lets_the_collector_read_a_0640_file_not_a_0600_one(
    tmp_path: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 31 item 2, the ACL route of docs/daemon.md: a collector directory closed to others
    (0700), with an access ACL that lets the collector's group in (`setfacl -m g:GROUP:rx`) and
    a default ACL that new files inherit (`setfacl -d -m g:GROUP:r`). With `metrics_file_mode =
    "0640"` the group's read is in the file's ACL mask and `nobody` (that group) reads the file,
    though it is neither its owner nor its group and others have nothing. With "0600" (the old
    mode, under which the old advice was given) the mask is `---` and the same ACL lets nobody
    in."""
    _uid, gid = as_nobody.ids()
    if shutil.which("setfacl") is None:
        pytest.skip("setfacl is not installed (Debian package acl): the ACL route is not tried")
    with as_nobody.workspace("memstaged-metrics-acl-") as shared:
        textfile = shared / "textfile"
        textfile.mkdir()
        textfile.chmod(0o700)
        _setfacl("-m", f"g:{gid}:rx", str(textfile))
        _setfacl("-d", "-m", f"g:{gid}:r", str(textfile))
        prom = textfile / "memstaged.prom"
        config = _config(tmp_path / "memstaged.toml", memory_dir, prom, "0640")
        daemon = spawn("--config", str(config), prefix=UMASK_077)
        wait_until(prom.exists, "the metrics file")
        assert _mode(prom) == 0o640
        acl = subprocess.run(
            ["getfacl", "-n", "-p", str(prom)], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        assert f"group:{gid}:r--" in acl and "mask::r--" in acl, acl
        read = as_nobody.run_as_nobody("cat", str(prom))
        assert read.returncode == 0, read.stderr
        assert "memstaged_memory_dirs_watched 1" in read.stdout.splitlines()

        _reload(daemon, config, memory_dir, prom, "0600")
        wait_until(lambda: _mode(prom) == 0o600, "the metrics file written 0600")
        refused = as_nobody.run_as_nobody("cat", str(prom))
        assert refused.returncode == 1
        assert "Permission denied" in refused.stderr
        assert daemon.stop() == 0


# -- what the counts mean --------------------------------------------------------------------------


def _status_decided(notify: NotifySocket) -> int | None:
    """The ``decided`` of the last ``STATUS=`` that gave the counts."""
    counts = [m for m in notify.statuses() if STATUS_DECIDED.search(m)]
    if not counts:
        return None
    match = STATUS_DECIDED.search(counts[-1])
    assert match is not None
    return int(match.group(1))


def _events(daemon: DaemonProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e["event"] == name]


def _check_exposition(prom: Path) -> None:
    """The file as promtool would lint it: every family has a HELP and a TYPE, every `_total`
    is a counter and every counter a `_total`; `memstaged_build_info` is the conventional
    gauge (value 1, the version `memstaged --version` prints); `memstaged_seen_files` a gauge."""
    text = prom.read_text()
    declared = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    helped = set(re.findall(r"^# HELP (\S+) \S", text, re.MULTILINE))
    assert helped == set(declared)
    for name, kind in declared.items():
        assert kind in ("counter", "gauge"), name
        assert (kind == "counter") == name.endswith("_total"), f"{name} is a {kind}"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for family in families.values():
        assert family.documentation, family.name
        for sample in family.samples:
            if sample.name.endswith("_total"):
                assert family.type == "counter", sample.name
    version = subprocess.run(
        [sys.executable, "-m", "memstaged", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()[-1]
    build = families["memstaged_build_info"]
    assert build.type == "gauge"
    assert [(s.name, s.labels, s.value) for s in build.samples] == [
        ("memstaged_build_info", {"version": version}, 1.0)
    ]
    seen = families["memstaged_seen_files"]
    assert seen.type == "gauge"
    assert sorted(s.labels["decision"] for s in seen.samples) == ["foreign", "valid"]
    if shutil.which("promtool") is not None:  # Debian's prometheus package; large, so optional
        lint = subprocess.run(
            ["promtool", "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert lint.returncode == 0 and lint.stdout + lint.stderr == "", lint.stdout + lint.stderr
    else:
        print("promtool is not installed: checked with prometheus_client's parser only")


def test_decided_agrees_across_stop_status_and_metrics_and_counters_restart_from_zero(
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
) -> None:
    """Issue 31 items 4 and 5: a daemon decides five files (two valid, one foreign, one
    repaired, whose rewrite it then looks at, and one that does not parse, deferred while it
    settles and then quarantined). Its `stop` event, its last counting `STATUS=` and its last
    metrics file all say 5 decided: the look at its own rewrite and the deferral are no
    decisions. A daemon restarted with nothing new made no decision: `ready` and `stop` say
    `decided` 0, STATUS= says 0 decided, every `memstaged_decisions_total` is 0 (a counter
    counts this process's events), while `memstaged_seen_files` shows what the seen cache holds
    from before (the two valid files and the repaired one's rewrite, valid; the foreign one)."""
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    config = _config(tmp_path / "memstaged.toml", memory_dir, prom)
    staging = memory_dir / "staging"
    notify = NotifySocket()
    try:
        first = spawn(
            "--config",
            str(config),
            prefix=UMASK_077,
            name="first",
            env={"NOTIFY_SOCKET": notify.path},
        )
        write(staging / "a.json", staging_doc(project, "a"))
        write(staging / "b.json", staging_doc(project, "b"))
        write(staging / "f.json", staging_doc(project / "elsewhere", "f"))
        fixme = staging_doc(project, "r")
        del fixme["candidates"]["lessons"][0]["triggers"]
        write(staging / "r.json", fixme)
        write(staging / "q.json", b'{"schemaVersion": 1, "session_id": "q"')
        future = time.time() + 3600  # settles from when the daemon first sees it: deferred then
        os.utime(staging / "q.json", (future, future))
        first.wait_decided("a.json", "b.json", "f.json", "r.json", "q.json")
        first.wait_for(
            lambda ev: any(e.get("own_rewrite") for e in ev), "the look at the repaired rewrite"
        )
        assert first.decisions("q.json")[-2:] == ["deferred", "quarantined"]
        assert first.decisions("r.json") == ["repaired", "valid"]  # the second: its own rewrite
        wait_until(lambda: _status_decided(notify) == 5, "STATUS= saying 5 decided")
        assert first.stop() == 0
        assert [e["decided"] for e in _events(first, "stop")] == [5]
        assert _status_decided(notify) == 5
        assert notify.statuses()[-1] == "stopping"
        found = samples(prom)  # the last write, at the clean stop
        assert _decisions_total(found) == {
            "valid": 2,
            "repaired": 1,
            "quarantined": 1,
            "foreign": 1,
            "skipped": 0,
        }
        assert found["memstaged_deferrals_total"] >= 1
        assert found["memstaged_seen_files{decision=valid}"] == 3
        assert found["memstaged_seen_files{decision=foreign}"] == 1
        _check_exposition(prom)
    finally:
        notify.close()

    prom.unlink()
    notify = NotifySocket()
    try:
        second = spawn(
            "--config",
            str(config),
            prefix=UMASK_077,
            name="second",
            env={"NOTIFY_SOCKET": notify.path},
        )
        [ready] = _events(second, "ready")
        assert (ready["decided"], ready["unchanged"]) == (0, 4)
        wait_until(prom.exists, "the restarted daemon's metrics file")
        wait_until(lambda: _status_decided(notify) is not None, "the restarted daemon's STATUS=")
        assert second.stop() == 0
        assert _events(second, "decision") == []
        assert [e["decided"] for e in _events(second, "stop")] == [0]
        assert _status_decided(notify) == 0
        found = samples(prom)
        assert _decisions_total(found) == dict.fromkeys(DECISIONS, 0)
        assert found["memstaged_deferrals_total"] == 0
        assert found["memstaged_seen_files{decision=valid}"] == 3
        assert found["memstaged_seen_files{decision=foreign}"] == 1
        _check_exposition(prom)
    finally:
        notify.close()
