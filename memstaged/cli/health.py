"""What ``memstaged status`` reports for each memory dir, and what needs care there.

The look at one memory dir (:func:`survey`), then at all of them (:func:`look`): what the
daemon holding each says of it through its control socket
(:mod:`memstaged.daemon.control_socket`), and whether the decision log can be written; and
memstaged's user unit, as the user manager has it (:func:`service`). How the command shows it
(a terminal, JSON, a monitoring plugin) is :mod:`memstaged.cli.commands.status`.

Read-only, as :mod:`memstaged.run.preview`, on which it builds: nothing here writes, renames or
deletes, not even a stale lock.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

import msgspec

from memstaged import safe_text
from memstaged.cli.commands import _common
from memstaged.cli.commands._common import human_age, memory_dirs
from memstaged.cli.commands._output import plural
from memstaged.cli.systemctl import systemctl
from memstaged.config import Settings, own_state_dir
from memstaged.core.decide import Decision
from memstaged.daemon import control_socket
from memstaged.deadletter import acks
from memstaged.deadletter.store import list_originals
from memstaged.errors import ConfigError, MemstagedError, Unanswered
from memstaged.files import fsio
from memstaged.files.locks import instance_holder, instance_lock_blocked, read_lock
from memstaged.files.memdir import DEADLETTER, MemoryDir, Options
from memstaged.files.version import CANNOT_READ
from memstaged.run.preview import StagingEntry, iter_staging

#: The per-file outcomes status counts: the six decisions (a file it may not read is deferred).
OUTCOMES: Final = [d.value for d in Decision]


class DirStatus(msgspec.Struct, kw_only=True):
    """What ``memstaged status`` reports for one memory dir."""

    memory_dir: str
    project_root: str
    staging: dict[str, int]
    files: list[StagingEntry]
    oldest_file: str | None = None
    oldest_age_seconds: float | None = None
    deadletter_records: int = 0
    #: Records not marked seen (``memstaged deadletter ack``): only these need attention.
    deadletter_unseen: int = 0
    deadletter_originals: int = 0
    canonical_lock: dict[str, Any] | None = None
    memstaged_pid: int | None = None
    memstaged_kind: str | None = None
    attention: list[str] = []
    #: Of ``attention``, what a monitor reports as CRITICAL (``status --check``): the memory dir
    #: cannot be looked into or watched, no daemon where one should run, no log written.
    critical: list[str] = []
    #: What the daemon holding the memory dir said of it (its control socket), when it answered.
    daemon_answered: bool | None = None
    #: The daemon's live counts, as its ``STATUS=`` says them (all its memory dirs).
    daemon_status: str | None = None
    watched: bool | None = None
    waiting: int | None = None
    oldest_wait_seconds: float | None = None


#: How the unseen dead-letter item of :func:`survey` reads, after its count: ``status --check``
#: finds it by this text, to count the unseen records apart.
UNSEEN: Final = "not yet seen: memstaged deadletter list"
#: How ``status`` names the memstaged holding the instance lock, by its role.
_ROLE_TEXT: Final = {
    "once": "--once run",
    "deadletter": "deadletter command",
    "daemon": "daemon",
}


def _deadletter_counts(mdir: MemoryDir, acked: set[str]) -> tuple[int, int, int]:
    names = acks.record_names(mdir)
    if not names and not Path(mdir.path, DEADLETTER).is_dir():
        return 0, 0, 0
    return len(names), acks.unseen(names, acked), len(list_originals(mdir))


def survey(
    mdir: MemoryDir,
    options: Options,
    *,
    clock: float,
    grace: float = 60.0,
    max_age: float | None = None,
    require_daemon: bool = False,
    acked: set[str] | None = None,
    state_dir: Path | None = None,
) -> DirStatus:
    """Look at ``mdir`` without changing it, and say what needs an operator's attention.

    Dead-letter records need it only until they are marked seen (``acked``, see
    :mod:`memstaged.deadletter.acks`): a quarantine is a normal outcome. The
    memstaged working on it is found by its instance lock, in ``state_dir`` (checked by the
    caller)."""
    status = DirStatus(
        memory_dir=mdir.path,
        project_root=mdir.project_root,
        staging={o: 0 for o in (*OUTCOMES, "total")},
        files=[],
    )
    attention = status.attention
    if not Path(mdir.path).is_dir():
        _critical(status, "the memory dir does not exist")
        return status
    try:
        status.files = [entry for entry, _v, _d in iter_staging(mdir, options, clock)]
    except OSError as err:
        why = "a symbolic link" if err.errno == errno.ELOOP else err.strerror
        _critical(status, f"cannot look into staging/: {why}")
    counts = Counter(e.decision for e in status.files)
    status.staging = {o: counts.get(o, 0) for o in OUTCOMES} | {"total": len(status.files)}
    _staging_attention(status, clock, grace, max_age)
    try:
        found = _deadletter_counts(mdir, acked or set())
        status.deadletter_records, status.deadletter_unseen, status.deadletter_originals = found
    except (OSError, MemstagedError) as err:
        attention.append(f"cannot look into deadletter/: {getattr(err, 'strerror', None) or err}")
    if status.deadletter_unseen:
        attention.append(
            f"{plural(status.deadletter_unseen, 'dead-letter record')} {UNSEEN}, then memstaged "
            "deadletter ack"
        )
    _lock_status(status, mdir, require_daemon, state_dir)
    return status


def _unreadable(entry: StagingEntry) -> bool:
    """A file memstaged may not read: deferred, but no wait will decide it (SPEC 5)."""
    return entry.decision == Decision.DEFERRED.value and (entry.reason or "").startswith(
        CANNOT_READ
    )


def _staging_attention(
    status: DirStatus, clock: float, grace: float, max_age: float | None
) -> None:
    attention = status.attention
    pending = [
        e
        for e in status.files
        if e.decision in (Decision.REPAIRED.value, Decision.QUARANTINED.value)
        and (e.mtime is None or clock - e.mtime >= grace)
    ]
    if pending:
        names = ", ".join(e.name for e in pending[:3]) + (", ..." if len(pending) > 3 else "")
        what = plural(len(pending), "staging file")
        attention.append(f"{what} not yet repaired or quarantined: {names}")
    odd = [e for e in status.files if e.decision == Decision.SKIPPED.value or _unreadable(e)]
    if odd:
        names = ", ".join(f"{e.name} ({e.reason})" for e in odd[:3])
        what = plural(len(odd), "staging entry", "staging entries")
        attention.append(f"{what} memstaged cannot decide: {names}")
    dated = [e for e in status.files if e.mtime is not None]
    if dated:
        oldest = min(dated, key=lambda e: e.mtime or 0.0)
        status.oldest_file = oldest.name
        status.oldest_age_seconds = round(clock - (oldest.mtime or clock), 3)
        if max_age is not None and status.oldest_age_seconds > max_age:
            attention.append(f"the oldest staging file ({oldest.name}) is older than --max-age")


def _lock_status(
    status: DirStatus, mdir: MemoryDir, require_daemon: bool, state_dir: Path | None
) -> None:
    try:
        with fsio.opened_dir(mdir.path) as mem_fd:
            info = read_lock(mem_fd)
    except OSError as err:
        status.attention.append(f"cannot read canonical-writer.lock: {err.strerror}")
        info = None
    if info is not None:
        status.canonical_lock = {"pid": info.pid, "owner": info.owner, "alive": info.alive}
        if not info.alive:
            status.attention.append(
                f"canonical-writer.lock names pid {info.pid}, which is gone (a stale lock)"
            )
    holder = instance_holder(state_dir, mdir)
    if holder is not None and holder.role is not None:
        status.memstaged_pid = holder.pid
        status.memstaged_kind = _ROLE_TEXT[holder.role]
    elif holder is not None:  # only the user's own processes may open it: not named
        _critical(status, "a process that is not memstaged holds its instance lock")
    elif require_daemon:
        _critical(status, "no memstaged daemon is running on it")
    if holder is None and (blocked := instance_lock_blocked(state_dir, mdir)) is not None:
        _critical(status, f"no memstaged can work on it: {blocked}")


def _critical(status: DirStatus, text: str) -> None:
    status.attention.append(text)
    status.critical.append(text)


def look(
    settings: Settings,
    *,
    deadline: float,
    grace: float,
    max_age: float | None,
    max_wait: float | None = None,
    require_daemon: bool = False,
) -> list[DirStatus]:
    """Every memory dir surveyed, and what the daemon holding it says of it: the daemons are
    asked until ``deadline`` (``time.monotonic``; ``--timeout`` bounds the whole look)."""
    mdirs = memory_dirs(settings, writable=False)
    state_dir = own_state_dir(settings, create=False)  # what is found there is trusted
    clock = _common.now()
    results = [
        survey(
            m,
            settings.options,
            clock=clock,
            grace=grace,
            max_age=max_age,
            require_daemon=require_daemon,
            acked=acks.load(state_dir, m.path),
            state_dir=state_dir,
        )
        for m in mdirs
    ]
    _ask_daemons(results, deadline, clock, max_wait)
    _log_file(results, settings)
    return results


def _ask(pid: int, deadline: float) -> control_socket.Live | str:
    """The daemon ``pid``'s answer, or why there is none, by ``deadline``: ``--timeout``
    bounds the whole look, however many daemons there are and however each fails."""
    left = deadline - time.monotonic()
    if left <= 0:
        return "not asked: --timeout was used up before its turn"
    try:
        return control_socket.ask(pid, left)
    except Unanswered as err:
        return str(err)


def _ask_daemons(
    results: list[DirStatus], deadline: float, clock: float, max_wait: float | None
) -> None:
    """Ask each daemon holding a memory dir, once, and put what it says beside the survey."""
    answers: dict[int, control_socket.Live | str] = {}
    for r in results:
        pid = r.memstaged_pid
        if pid is None or r.memstaged_kind != "daemon":
            continue
        if pid not in answers:
            answers[pid] = _ask(pid, deadline)
        answer = answers[pid]
        if isinstance(answer, str):
            r.daemon_answered = False
            _critical(r, f"the memstaged daemon (pid {pid}) does not answer: {answer}")
            continue
        r.daemon_answered = True
        r.daemon_status = answer.status
        here = control_socket.wire(r.memory_dir)
        live = next((d for d in answer.memory_dirs if d.memory_dir == here), None)
        if answer.log_failing:
            _critical(r, "the daemon cannot write its decision log")
        if live is None:
            why = answer.not_watched.get(here, "not among its memory dirs")
            _critical(r, f"the daemon holding it does not watch it: {why}")
            continue
        r.watched = live.watched
        r.waiting = live.waiting + live.lock_waiting
        if live.oldest_wait_since is not None:
            r.oldest_wait_seconds = round(max(answer.now - live.oldest_wait_since, 0.0), 3)
        if live.staging_exists and not live.watched:
            _critical(r, "the daemon cannot watch staging/ (rescans only)")
        if (
            max_wait is not None
            and r.oldest_wait_seconds is not None
            and r.oldest_wait_seconds > max_wait
        ):
            r.attention.append(
                f"a file has waited {human_age(r.oldest_wait_seconds)} for its decision "
                f"(more than --max-wait)"
            )
    unheld = [r for r in results if r.memstaged_pid is None]
    if unheld:
        _not_worked_on(unheld, answers, deadline)


def _not_worked_on(
    unheld: list[DirStatus], answers: dict[int, control_socket.Live | str], deadline: float
) -> None:
    """A memory dir no memstaged holds may be one a daemon found and could not work on (it
    cannot be opened, the descriptor limit): every daemon of this user (its socket under the
    runtime dir) is asked, once, whether it is."""
    for pid in control_socket.daemon_pids():
        if pid not in answers:
            answers[pid] = _ask(pid, deadline)
    for r in unheld:
        here = control_socket.wire(r.memory_dir)
        for pid, answer in sorted(answers.items()):
            if not isinstance(answer, str) and here in answer.not_watched:
                why = answer.not_watched[here]
                _critical(r, f"the memstaged daemon (pid {pid}) cannot work on it: {why}")
                break


def _log_file(results: list[DirStatus], settings: Settings) -> None:
    """CRITICAL for every memory dir when the decision log cannot be written (SPEC 7: no
    decision is carried out unlogged, so none would be made)."""
    why = _unwritable(str(settings.log_file))
    if why is None:
        return
    for r in results:
        _critical(r, f"the decision log {safe_text.name(str(settings.log_file))} {why}")


def _unwritable(path: str) -> str | None:
    if os.path.lexists(path):
        return None if os.access(path, os.W_OK) else "cannot be written"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):  # created with its parents at the first event
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return "cannot be created"
    return None


#: The unit ``memstaged service install`` writes (:data:`memstaged.cli.systemd_unit.UNIT_NAME`).
UNIT: Final = "memstaged.service"
#: The unit's properties ``status --check`` asks the user manager for.
_PROPERTIES: Final = ("LoadState", "UnitFileState", "ActiveState", "SubState", "Result")
#: What ``is-enabled`` calls enabled: the unit starts with the user's manager.
_ENABLED: Final = frozenset({"enabled", "enabled-runtime"})


class Service(msgspec.Struct, frozen=True, kw_only=True):
    """memstaged's systemd user unit, as the user manager sees it (``systemctl --user show``)."""

    unit_file_state: str
    active_state: str
    sub_state: str
    result: str

    @property
    def enabled(self) -> bool:
        """Enabled: a daemon is meant to run, so a monitor requires one."""
        return self.unit_file_state in _ENABLED

    def problem(self) -> str | None:
        """Why the enabled unit is not running, in ``systemctl``'s own words; None when it
        runs (``active``, ``reloading``)."""
        state = self.active_state
        if state in ("active", "reloading"):
            return None
        if state == "inactive":
            return f"{UNIT} is enabled but stopped (inactive): systemctl --user start memstaged"
        if state == "failed":
            return f"{UNIT} failed ({self.result}): journalctl --user -u memstaged"
        return f"{UNIT} is not running: {state} ({self.sub_state})"


def service(timeout: float) -> Service | None:
    """memstaged's user unit as the user's manager has it, asked within ``timeout`` seconds;
    None when there is no such unit, or no user manager answers (no systemd, another user's
    session, a manager that hangs): then no unit is taken to be meant to run.

    A monitor run from cron or NRPE has no ``XDG_RUNTIME_DIR``: the user's ``/run/user/<uid>``
    is used, as for the control socket, so that ``systemctl --user`` finds the manager there.
    """
    env = dict(os.environ)
    found = control_socket.runtime_dir(env)
    if found is not None and not env.get("XDG_RUNTIME_DIR", "").startswith("/"):
        env["XDG_RUNTIME_DIR"] = str(found.parent)
    properties = [f"--property={name}" for name in _PROPERTIES]
    try:
        done = systemctl("show", UNIT, *properties, timeout=timeout, env=env)
    except (ConfigError, OSError):  # no systemctl; a manager that hangs
        return None
    if done.returncode != 0:  # no user manager to ask (no bus, no XDG_RUNTIME_DIR)
        return None
    shown = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
    if shown.get("LoadState", "not-found") == "not-found":  # not installed (or removed)
        return None
    return Service(
        unit_file_state=shown.get("UnitFileState", ""),
        active_state=shown.get("ActiveState", ""),
        sub_state=shown.get("SubState", ""),
        result=shown.get("Result", ""),
    )
