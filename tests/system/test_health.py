"""A health check a monitor can use, and metrics (issue 21 items 6 and 7).

``status --check`` (Monitoring Plugins line and exit codes), ``deadletter ack``, the one-line
summary per memory dir, the daemon's control socket (a real daemon process, stopped with a real
SIGSTOP), and the metrics file (written by a real daemon, read back with ``prometheus_client``'s
own parser).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import select
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from support.commands import prepare, run, status_json
from support.daemon_process import DaemonProcess, glob_config, many_projects
from support.documents import staging_doc, write
from support.failing_fs import Broken
from support.helpers import memstaged_cmd, memstaged_env, mounted, run_once, without_dac_override
from support.metrics import sample, samples
from support.terminal import pty_run
from support.waiting import wait_until

from memstaged.cli.commands.status import TERMINAL_COLUMNS
from memstaged.daemon import control_clients, control_socket
from memstaged.deadletter import acks

pytestmark = pytest.mark.usefixtures("plain_output")

#: One Monitoring Plugins performance datum: 'label'=value[UOM];[warn];[crit];[min];[max].
PERFDATUM = re.compile(r"[a-z_]+=-?[0-9.]+(s|%|B|c)?(;[0-9.:~@]*){0,4}")


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    """``status --check``: its exit code, its text (the first line's, then the lines after it,
    the long output, if any) and its performance data (on the first line only)."""
    code, out, err = run(capsys, "status", "--check", *argv)
    assert err == ""
    line, *detail = out.splitlines()
    assert line.startswith("MEMSTAGED "), line
    text, _, perf = line.partition(" | ")
    assert all(" | " not in d for d in detail), detail
    data = perf.split(" ")
    assert all(PERFDATUM.fullmatch(d) for d in data), data
    return code, "\n".join([text, *detail]), data


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- status --check and deadletter ack, without a daemon ----------------------------------------


def test_check_is_ok_then_warns_for_unseen_records_until_they_are_acked(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 21 item 6: a quarantine makes `status --check` WARNING (exit 1) only until its
    records are marked seen with `deadletter ack`; the mark lives in the state dir and the
    memory dir is left byte for byte as it was; a new quarantine is unseen again."""
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir))
    assert (code, text) == (0, "MEMSTAGED OK - 1 memory dir, nothing needs attention")
    assert "unseen=0;0;;0" in perf
    prepare(project, memory_dir, log_file)
    records = sorted(p.stem for p in (memory_dir / "deadletter").glob("*.json"))
    assert len(records) == 5
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir))
    assert code == 1
    assert text.startswith("MEMSTAGED WARNING - 5 dead-letter records not yet seen")
    assert "unseen=5;0;;0" in perf
    assert "deadletter_records=5;;;0" in perf
    code, text, _ = _check(capsys, "--memory-dir", str(memory_dir), "--max-unseen", "5")
    assert code == 0  # the threshold is an option

    before = _tree(memory_dir)
    code, out, err = run(
        capsys, "deadletter", "ack", records[0][:30], "--memory-dir", str(memory_dir)
    )
    assert (code, err) == (0, "")
    assert out == f"{memory_dir}: 1 record marked seen, 4 not yet seen\n"
    code, result = status_json(capsys, memory_dir)
    assert (code, result["deadletter_unseen"], result["deadletter_records"]) == (1, 4, 5)
    code, out, _ = run(capsys, "deadletter", "ack", "--all", "--memory-dir", str(memory_dir))
    assert out == f"{memory_dir}: 4 records marked seen, 0 not yet seen\n"
    assert _tree(memory_dir) == before  # nothing written into the memory dir (SPEC 6)
    marks = list((log_file.parent / "memstaged" / acks.ACKED_DIR).iterdir())
    assert len(marks) == 1
    assert stat.S_IMODE(marks[0].stat().st_mode) == 0o600
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir))
    assert (code, "unseen=0;0;;0" in perf) == (0, True)
    code, out, _ = run(capsys, "status", "--memory-dir", str(memory_dir))
    assert (code, out.splitlines()[-1]) == (0, "nothing needs attention")

    write(memory_dir / "staging" / "late.json", b"not json")
    assert run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")[0] == 0
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir))
    assert code == 1
    assert "unseen=1;0;;0" in perf


def test_check_is_unknown_for_a_bad_configuration_and_critical_for_an_unwritable_log(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    log_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 6: the check that cannot run is UNKNOWN (3) with its reason on the one
    line; a decision log that cannot be written (here: under a regular file) is CRITICAL (2),
    and so is a configured memory dir that does not exist."""
    code, out, _ = run(capsys, "status", "--check", "--config", str(tmp_path / "none.toml"))
    assert code == 3
    assert out.startswith("MEMSTAGED UNKNOWN - ") and "none.toml" in out
    assert len(out.splitlines()) == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(blocker / "decisions.jsonl"))
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir))
    assert code == 2
    assert text.startswith("MEMSTAGED CRITICAL - ")
    assert "decisions.jsonl cannot be created" in text
    assert "critical=1;;0;0" in perf
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(log_file))
    gone = tmp_path / "gone"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'memory_dirs = ["{memory_dir}", "{gone}"]\n')
    code, text, _ = _check(capsys, "--config", str(cfg))
    assert code == 2
    assert f"{gone}: the memory dir does not exist" in text


def test_a_thousand_memory_dirs_are_a_thousand_lines_within_80_columns(
    tmp_path: Path, log_file: Path
) -> None:
    """Issue 21 item 6 ("1,000 dirs must be readable"): the real `memstaged status` on 1,000
    memory dirs, on an 80-column pseudo-terminal, prints exactly one line per memory dir, each
    within 80 columns (the project's short label; the full path made every row wider), and
    exits 1 for the one that needs attention; piped, one tab-separated row per memory dir with
    its full path, as scripts cut it."""
    dirs = []
    for i in range(1000):
        mdir = tmp_path / "src" / f"service-{i:04d}" / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        dirs.append(mdir)
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log_file), NO_COLOR="1")
    write(dirs[7] / "staging" / "bad.json", b"not json")
    assert run_once(dirs[7], env, "--settle", "0").returncode == 0
    pattern = str(tmp_path / "src" / "*" / ".pi" / "memory" / "project")

    code, shown = pty_run(memstaged_cmd("status", "--memory-dir", pattern), env)
    assert code == 1, shown[-2000:]
    lines = shown.decode().replace("\r\n", "\n").splitlines()
    assert lines[0] == "1000 memory dirs"
    assert lines[1].split() == list(TERMINAL_COLUMNS)
    rows = [line.split() for line in lines[2:1002]]
    assert [r[0] for r in rows] == [f"service-{i:04d}" for i in range(1000)]
    assert rows[7][4:6] == ["1", "1"] and rows[7][-1] == "attention"
    assert sum(r[-1] == "ok" for r in rows) == 999
    assert lines[1002:] == ["", "1 of 1000 memory dirs needs attention: memstaged status -v"]
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide[:3]

    piped = subprocess.run(
        memstaged_cmd("status", "--memory-dir", pattern), env=env, capture_output=True, check=False
    )
    assert piped.returncode == 1
    table = piped.stdout.decode().splitlines()
    assert table[0] == "# 1000 memory dirs"
    assert [line.split("\t")[0] for line in table[2:1002]] == [str(d) for d in dirs]
    assert table[1002:] == ["1 of 1000 memory dirs needs attention: memstaged status -v"]


# -- the daemon's control socket (a real daemon) -------------------------------------------------


def _daemon_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon: DaemonProcess) -> None:
    """This process's commands see what the daemon's do: its log, its state dir."""
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(daemon.log_file))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_daemon_is_critical_within_the_timeout(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 6: with the daemon SIGSTOPped, `status --check` is CRITICAL (exit 2) and
    `status --require-daemon` needs attention (it said "nothing needs attention" before);
    resumed, it answers again and the check is OK. The socket is private (0700 dir, 0600)."""
    daemon = spawn("--memory-dir", str(memory_dir))
    _daemon_env(tmp_path, monkeypatch, daemon)
    sock = Path(os.environ["XDG_RUNTIME_DIR"]) / "memstaged" / f"daemon-{daemon.proc.pid}.sock"
    assert stat.S_ISSOCK(sock.lstat().st_mode)
    assert stat.S_IMODE(sock.lstat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir), "--require-daemon")
    assert (code, text) == (0, "MEMSTAGED OK - 1 memory dir, nothing needs attention")
    assert "not_answering=0;;0;0" in perf

    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _process_state(daemon.proc.pid) == "T", "the daemon stopped")
        code, text, perf = _check(
            capsys, "--memory-dir", str(memory_dir), "--require-daemon", "--timeout", "1"
        )
        assert code == 2
        assert text.startswith("MEMSTAGED CRITICAL - ")
        assert f"memstaged daemon (pid {daemon.proc.pid}) does not answer" in text
        assert "not_answering=1;;0;0" in perf
        code, out, _ = run(
            capsys, "status", "--memory-dir", str(memory_dir), "--require-daemon",
            "--timeout", "1",
        )  # fmt: skip
        assert code == 1
        assert "does not answer" in out and "nothing needs attention" not in out
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    code, text, _ = _check(capsys, "--memory-dir", str(memory_dir), "--require-daemon")
    assert code == 0
    assert daemon.stop() == 0
    assert not sock.exists()  # removed at a clean stop


def test_a_manager_that_hangs_leaves_the_daemons_time_to_answer(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a user manager that never answers (a stand-in ``systemctl`` that sleeps), the
    manager used the whole `--timeout` and a healthy daemon was CRITICAL, "not asked". The
    manager has half of it at most: the daemon answers and the check is OK."""
    daemon = spawn("--memory-dir", str(memory_dir))
    _daemon_env(tmp_path, monkeypatch, daemon)
    bin_dir = tmp_path / "hung-bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexec sleep 600\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir), "--timeout", "4")
    assert (code, text) == (0, "MEMSTAGED OK - 1 memory dir, nothing needs attention")
    assert "not_answering=0;;0;0" in perf
    assert daemon.stop() == 0


def test_status_shows_the_daemons_live_queue_and_waits(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 6: `status` shows what the daemon itself holds: a file it deferred (not
    yet settled) is waiting, since its last change; `--check --max-wait` warns about it."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "3600")
    _daemon_env(tmp_path, monkeypatch, daemon)
    write(memory_dir / "staging" / "half.json", b'{"session_id": "half", ')
    daemon.wait_for(
        lambda ev: any(e["event"] == "decision" and e["decision"] == "deferred" for e in ev),
        "half.json deferred",
    )
    code, result = status_json(capsys, memory_dir)
    assert result["daemon_answered"] is True
    assert result["watched"] is True
    assert result["waiting"] == 1
    assert result["oldest_wait_seconds"] is not None
    code, out, _ = run(capsys, "status", "--memory-dir", str(memory_dir))
    assert "  files waiting\t1" in out.splitlines()
    assert "  says\twatching 1 memory dirs; 0 decided, 0 quarantined, 0 repaired, 1 waiting" in out
    code, text, perf = _check(capsys, "--memory-dir", str(memory_dir), "--max-wait", "0s")
    assert code == 1
    assert "for its decision (more than --max-wait)" in text
    assert "waiting=1;;;0" in perf
    code, _, _ = _check(capsys, "--memory-dir", str(memory_dir), "--max-wait", "1h")
    assert code == 0


@contextlib.contextmanager
def _connected(pid: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` clients connected to the daemon's control socket that say nothing."""
    clients: list[socket.socket] = []
    try:
        for _ in range(count):
            clients.append(_client(pid))
        yield clients
    finally:
        for client in clients:
            client.close()


def _client(pid: int, request: bytes = b"") -> socket.socket:
    """A connection to the daemon's control socket (named through its directory's descriptor:
    a test's path is too long for ``sun_path``), that sent ``request``."""
    path = control_socket.socket_path(pid)
    assert path is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.settimeout(0.2)  # a full listen queue: the caller tries again
        sock.connect(f"/proc/self/fd/{fd}/{path.name}")
        sock.sendall(request)
    except OSError:
        sock.close()
        raise
    finally:
        os.close(fd)
    return sock


class NeverReading:
    """Clients that connect, ask ``status`` and never read their answer; each one the daemon
    closes is replaced by another at once, so as many always wait on it."""

    def __init__(self, pid: int, count: int) -> None:
        self.pid = pid
        self.count = count
        self.closed = 0  # by the daemon
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="never-reading")

    def __enter__(self) -> NeverReading:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        clients: dict[int, socket.socket] = {}
        poller = select.poll()
        try:
            while not self.stop.is_set():
                while len(clients) < self.count and not self.stop.is_set():
                    with contextlib.suppress(OSError):  # the listen queue is full: again
                        client = _client(self.pid, control_clients.REQUEST)
                        clients[client.fileno()] = client
                        poller.register(client, select.POLLHUP)
                for fd, _ in poller.poll(100):  # POLLHUP: the daemon closed it, unread
                    poller.unregister(fd)
                    clients.pop(fd).close()
                    self.closed += 1
        finally:
            for client in clients.values():
                client.close()


def test_clients_that_say_nothing_do_not_make_a_live_daemon_critical(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 29 item 1: twelve clients connected to the control socket that send nothing made
    `status --check --require-daemon` say "does not answer" (CRITICAL, exit 2) while the
    daemon decided files: each silent one held up the accepting of the next for a second. A
    silent client now holds up no other: the check is OK while they are all still connected,
    and the daemon still decides a file."""
    daemon = spawn("--memory-dir", str(memory_dir))
    _daemon_env(tmp_path, monkeypatch, daemon)
    with _connected(daemon.proc.pid, 12):
        code, text, perf = _check(capsys, "--memory-dir", str(memory_dir), "--require-daemon")
        assert (code, text) == (0, "MEMSTAGED OK - 1 memory dir, nothing needs attention")
        assert "not_answering=0;;0;0" in perf
        write(memory_dir / "staging" / "bad.json", b"{not json")
        assert daemon.wait_decided("bad.json")["bad.json"]["decision"] == "quarantined"
    assert daemon.stop() == 0


def _socket_buffer() -> int:
    """The default send buffer of a socket (the daemon's: it sets none)."""
    return int(Path("/proc/sys/net/core/wmem_default").read_text())


def test_clients_that_never_read_delay_neither_decisions_nor_sigterm(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 29 item 2: with 1,000 memory dirs the daemon's answer is larger than what a
    socket buffers, and the work loop itself wrote it to each client, waiting up to a second
    for each: clients that ask and never read (here twelve, each replaced as soon as the daemon
    closes it) held the loop for ever, so a new file was never decided and SIGTERM never acted
    on. The loop now only makes the answer; it is sent by another thread that waits on no
    client: the file is decided and SIGTERM ends the daemon while they keep asking."""
    src = tmp_path / ("s" * 250)  # long paths: a large answer
    mdirs = many_projects(src, 1000)
    daemon = spawn("--config", str(glob_config(tmp_path, src)))
    pid = daemon.proc.pid
    answer = msgspec.json.encode(control_socket.ask(pid, timeout=60))
    assert len(answer) > 1.5 * _socket_buffer()  # the premise: a client that does not read blocks
    with NeverReading(pid, 12) as flood:
        wait_until(lambda: flood.closed >= 12, "the daemon closing clients that never read")
        (mdirs[-1] / "staging" / "new.json").write_bytes(b"{not json")
        assert daemon.wait_decided("new.json")["new.json"]["decision"] == "quarantined"
        assert daemon.stop() == 0


def _answer(client: socket.socket) -> control_socket.Live:
    """Ask on a connected client and read its whole answer (within a generous bound)."""
    client.settimeout(30)
    client.sendall(control_clients.REQUEST)
    chunks = []
    while chunk := client.recv(1 << 16):
        chunks.append(chunk)
    return msgspec.json.decode(b"".join(chunks), type=control_socket.Live)


def test_honest_clients_that_connect_together_are_all_answered(
    memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 29 D1: when a fifth client connected, the daemon closed the oldest one that had
    not sent its request yet, to make room. An honest client is silent between its `connect`
    and its `send`, so five `status` runs at once closed each other ("Broken pipe", a false
    CRITICAL). Here eight clients connect before any of them asks, as a burst of checks does:
    every one is answered, since a client keeps its place for a grace period after connecting."""
    daemon = spawn("--memory-dir", str(memory_dir))
    pid = daemon.proc.pid
    clients = []
    try:
        for _ in range(2 * control_clients.MAX_CLIENTS):
            clients.append(_client(pid))
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as asking:  # all at once
            answers = list(asking.map(_answer, clients))
    finally:
        for client in clients:
            client.close()
    assert [a.pid for a in answers] == [pid] * len(clients)
    assert daemon.stop() == 0


def _fill_listen_queue(pid: int) -> list[socket.socket]:
    """Connections that say nothing, made until the daemon's listen queue is full."""
    path = control_socket.socket_path(pid)
    assert path is not None
    queued: list[socket.socket] = []
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)  # EAGAIN at once: the queue is full
            try:
                sock.connect(f"/proc/self/fd/{fd}/{path.name}")
            except BlockingIOError:
                sock.close()
                return queued
            queued.append(sock)
    finally:
        os.close(fd)


def test_a_full_listen_queue_is_waited_on_not_reported_as_a_dead_daemon(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 29 D2: `status` connected without blocking, and a full listen queue fails such a
    connect with EAGAIN at once: a daemon busy with clients was "not answering" (CRITICAL) in
    0.3 s. Here every place is held by a client that asked and does not read an answer larger
    than the socket buffers, and the listen queue is then filled: the check's connect waits in
    the kernel for a place (bounded by its timeout), and it is answered."""
    src = tmp_path / ("s" * 250)  # long paths: an answer larger than the socket buffers
    many_projects(src, 1000)
    daemon = spawn("--config", str(glob_config(tmp_path, src)))
    pid = daemon.proc.pid
    holders = [_client(pid, control_clients.REQUEST) for _ in range(control_clients.MAX_CLIENTS)]
    queued: list[socket.socket] = []
    try:
        for holder in holders:  # each has its answer partly sent: it holds a place
            holder.settimeout(60)
            assert holder.recv(1)
        queued = _fill_listen_queue(pid)
        assert queued, "the listen queue took no connection"
        assert control_socket.ask(pid, timeout=60).pid == pid
    finally:
        for sock in holders + queued:
            sock.close()
    assert daemon.stop() == 0


# -- metrics ------------------------------------------------------------------------------------


def test_metrics_file_is_written_by_the_daemon_and_follows_ack(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 7: with `metrics_file` set the daemon writes the textfile collector's
    format (parsed here by prometheus_client's own parser), mode 0600 (SPEC 6; issue 31 item 2's
    0644 is `metrics_file_mode`'s to choose): decisions by decision,
    repairs by rule, quarantined candidates, dead-letter records and unseen ones (refreshed
    by `deadletter ack`), memory dirs watched, the last decision and the start time."""
    prom = tmp_path / "textfile" / "memstaged.prom"
    prom.parent.mkdir()
    cfg = tmp_path / "memstaged.toml"
    cfg.write_text(f'memory_dirs = ["{memory_dir}"]\nmetrics_file = "{prom}"\nsettle = 0\n')
    daemon = spawn("--config", str(cfg))
    _daemon_env(tmp_path, monkeypatch, daemon)
    wait_until(prom.exists, "the metrics file")
    assert stat.S_IMODE(prom.stat().st_mode) == 0o600
    fixme = staging_doc(project, "fix")
    del fixme["candidates"]["lessons"][0]["triggers"]
    write(memory_dir / "staging" / "fixme.json", fixme)
    write(memory_dir / "staging" / "broken.json", b"not json at all")
    daemon.wait_decided("fixme.json", "broken.json")
    wait_until(
        lambda: (
            sample(prom, "memstaged_quarantined_candidates_total") == 1
            and sample(prom, "memstaged_decisions_total{decision=repaired}") == 1
        ),
        "the decisions in the metrics file",
    )
    found = samples(prom)
    assert found["memstaged_decisions_total{decision=quarantined}"] == 1
    assert found["memstaged_repairs_total{rule=R1}"] >= 1
    assert found["memstaged_deadletter_records"] == 1
    assert found["memstaged_deadletter_unseen_records"] == 1
    assert found["memstaged_memory_dirs_watched"] == 1
    assert found["memstaged_memory_dirs_not_watched"] == 0
    assert found["memstaged_watch_failures_total"] == 0
    assert found["memstaged_log_write_failing"] == 0
    assert found["memstaged_waiting_files"] == 0
    assert "memstaged_oldest_wait_timestamp_seconds" not in found  # none waits
    assert (
        found["memstaged_last_decision_timestamp_seconds"] >= found["memstaged_start_time_seconds"]
    )
    assert found["memstaged_process_start_time_seconds"] > 0
    assert not list(prom.parent.glob(".*.tmp"))  # the temp file was renamed

    code, _, _ = run(capsys, "deadletter", "ack", "--all", "--memory-dir", str(memory_dir))
    assert code == 0
    wait_until(
        lambda: sample(prom, "memstaged_deadletter_unseen_records") == 0,
        "the unseen count after ack",
    )
    assert daemon.stop() == 0


def test_metrics_file_gives_the_waiting_file_and_when_its_wait_began(
    tmp_path: Path,
    memory_dir: Path,
    spawn: Callable[..., DaemonProcess],
) -> None:
    """Issue 21 item 7 ("waits and the oldest wait"): a file the daemon holds back (it does not
    parse yet and is within its settle interval) is one waiting file in the metrics file, and
    the oldest wait is its last change, a timestamp an alert subtracts from time()."""
    prom = tmp_path / "m.prom"
    cfg = tmp_path / "memstaged.toml"
    cfg.write_text(f'memory_dirs = ["{memory_dir}"]\nmetrics_file = "{prom}"\nsettle = 3600\n')
    daemon = spawn("--config", str(cfg))
    half = memory_dir / "staging" / "half.json"
    write(half, b'{"session_id": "half", ')
    daemon.wait_for(
        lambda ev: any(e["event"] == "decision" and e["decision"] == "deferred" for e in ev),
        "half.json deferred",
    )
    wait_until(lambda: sample(prom, "memstaged_waiting_files") == 1, "one waiting file")
    found = samples(prom)
    assert found["memstaged_oldest_wait_timestamp_seconds"] == pytest.approx(
        half.stat().st_mtime, abs=0.001
    )
    assert found["memstaged_deferrals_total"] >= 1
    assert daemon.stop() == 0


def test_metrics_say_while_the_log_cannot_be_written_and_when_it_can_again(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 21 item 7 ("log write failures"): the daemon's decision log is on a small real
    tmpfs, filled after the daemon started. A file that arrives then waits (its bytes
    untouched), and the metrics file says so: `memstaged_log_write_failing` 1 and
    `memstaged_log_write_failures_total` counting the events not written. With room again the
    daemon decides the file by itself, the flag goes back to 0 and the counter does not."""
    logfs = tmp_path / "logfs"
    with mounted(logfs, "-t", "tmpfs", "-o", "size=64k", "tmpfs"):
        broken = Broken("enospc", logfs)
        prom = tmp_path / "m.prom"
        cfg = tmp_path / "memstaged.toml"
        cfg.write_text(f'memory_dirs = ["{memory_dir}"]\nmetrics_file = "{prom}"\nsettle = 0\n')
        daemon = spawn("--config", str(cfg), log_file=broken.log)
        wait_until(lambda: sample(prom, "memstaged_log_write_failing") == 0, "the first metrics")
        assert samples(prom)["memstaged_log_write_failures_total"] == 0

        broken.break_it()
        fixme = staging_doc(project, "fix")
        del fixme["candidates"]["lessons"][0]["triggers"]
        data = write(memory_dir / "staging" / "fixme.json", fixme)
        wait_until(
            lambda: sample(prom, "memstaged_log_write_failing") == 1,
            "the metrics to say that the log cannot be written",
        )
        found = samples(prom)
        assert found["memstaged_log_write_failures_total"] >= 1
        assert found.get("memstaged_decisions_total{decision=repaired}") == 0
        assert (memory_dir / "staging" / "fixme.json").read_bytes() == data  # nothing done

        broken.mend()
        wait_until(
            lambda: (
                sample(prom, "memstaged_log_write_failing") == 0
                and sample(prom, "memstaged_decisions_total{decision=repaired}") == 1
            ),
            "the metrics to say that the log works again",
            timeout=90,  # the daemon's back-off after a few failures: seconds
        )
        assert samples(prom)["memstaged_log_write_failures_total"] >= 1  # a counter stays
        assert (memory_dir / "staging" / "fixme.json").read_bytes() != data  # repaired now
        assert daemon.stop() == 0


def test_metrics_count_a_staging_dir_that_cannot_be_watched(
    tmp_path: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 21 item 7 ("watch failures"): a `staging/` the daemon may not read (mode 000, the
    daemon run without root's override of file permissions) cannot be given an inotify watch;
    the metrics file says one watch failure and one memory dir not watched. Once staging/ is
    made anew readable, the daemon watches it again: not watched goes back to 0, the failure
    counter stays."""
    staging = memory_dir / "staging"
    staging.chmod(0)
    prom = tmp_path / "m.prom"
    cfg = tmp_path / "memstaged.toml"
    cfg.write_text(f'memory_dirs = ["{memory_dir}"]\nmetrics_file = "{prom}"\nsettle = 0\n')
    daemon = spawn("--config", str(cfg), prefix=without_dac_override())
    wait_until(
        lambda: sample(prom, "memstaged_memory_dirs_not_watched") == 1,
        "the metrics to say a memory dir is not watched",
    )
    found = samples(prom)
    assert found["memstaged_watch_failures_total"] >= 1
    assert [e["memory_dir"] for e in daemon.events() if e["event"] == "watch_failed"] == [
        str(memory_dir)
    ]

    staging.rmdir()
    staging.mkdir()  # its memory dir's watch sees it come back, readable
    wait_until(
        lambda: sample(prom, "memstaged_memory_dirs_not_watched") == 0,
        "the metrics to say the memory dir is watched again",
    )
    assert samples(prom)["memstaged_watch_failures_total"] >= 1
    assert samples(prom)["memstaged_memory_dirs_watched"] == 1
    assert daemon.stop() == 0


def test_a_memory_dir_whose_name_is_not_utf8_is_answered_for(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 6 with SPEC 6 (a name is bytes): the daemon's answer carries a memory dir
    path that is not UTF-8, and status matches it; the daemon keeps running."""
    project = tmp_path / os.fsdecode(b"caf\xe9")
    memory_dir = project / ".pi" / "memory" / "project"
    (memory_dir / "staging").mkdir(parents=True)
    daemon = spawn("--memory-dir", str(memory_dir))
    _daemon_env(tmp_path, monkeypatch, daemon)
    code, text, _ = _check(capsys, "--memory-dir", str(memory_dir), "--require-daemon")
    assert (code, text) == (0, "MEMSTAGED OK - 1 memory dir, nothing needs attention")
    code, result = status_json(capsys, memory_dir)
    assert (result["daemon_answered"], result["watched"]) == (True, True)
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_memory_dirs_a_daemon_cannot_work_on_are_critical(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    spawn: Callable[..., DaemonProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 21 item 6: a memory dir the daemon found but cannot watch (here: beyond its hard
    descriptor limit, 64 for 50 projects) is held by no memstaged, so status used to see
    nothing wrong; the daemon says so when asked, and `status --check` is CRITICAL for it."""
    src = tmp_path / "src"
    for i in range(50):
        (src / f"p{i:02}" / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'memory_dirs = ["{src}/*/.pi/memory/project"]\n')
    daemon = spawn("--config", str(cfg), nofile=(64, 64))
    _daemon_env(tmp_path, monkeypatch, daemon)
    refused = [e["memory_dir"] for e in daemon.events() if e["event"] == "memory_dir_error"]
    assert refused  # the premise: some are beyond the limit
    code, text, perf = _check(capsys, "--config", str(cfg))
    assert code == 2
    assert f"{refused[0]}: the memstaged daemon (pid {daemon.proc.pid}) cannot work on it: " in text
    assert "descriptor limit reached" in text
    assert f"critical={len(refused)};;0;0" in perf
    assert daemon.stop() == 0
