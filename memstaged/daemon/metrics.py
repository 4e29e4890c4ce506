"""OpenMetrics/Prometheus metrics in a file, for node_exporter's textfile collector.

With ``metrics_file`` set, the daemon writes its metrics there in Prometheus's text exposition
format (0.0.4, what node_exporter's textfile collector reads), atomically: a temp file beside it
(``.<name>.<pid>.tmp``, which the collector ignores: it reads ``*.prom``), then a rename. Its
mode is ``metrics_file_mode`` (0600 by default, as SPEC 6 makes every file memstaged
creates; "0644" or "0640" for a collector that runs as another user), set on the temp file
with ``fchmod``, so that the unit's ``UMask=0077`` does not take the bits away. It holds counts
and times only: no path, no file name, no content. It is written from the work loop, only after
something happened (an event was logged, or ``deadletter ack`` said that marks changed), and at
most every :data:`MIN_INTERVAL` seconds: an idle daemon writes nothing and sets no timer. Ages
are given as timestamps (the oldest wait, the last decision), so that a file written once stays
true while nothing happens; an alert computes ``time() - …``.

A ``_total`` counts this process's events, from 0 at each start, as Prometheus expects of a
counter (a restart is a reset, which ``rate()`` and ``increase()`` handle); what the seen cache
holds from earlier runs is a gauge (``memstaged_seen_files``).

The counts come from the daemon's own state (decisions by decision, files waiting, memory dirs
watched, the seen caches) and from :class:`Tally`, which sees every event the daemon logs
(repairs by rule, quarantined candidates, watch failures, the last decision); the log file's
failed writes are counted by the log itself (:func:`memstaged.log.rotated_file.failed_writes`),
across reloads.

The text is written here, not by ``prometheus_client`` (measured): importing it took
4.2 MB of the idle daemon's resident memory (about 30 MB with it, against a target of 25) and
0.1 s, for 16 lines of a format that has not changed since 2014. The tests read the file with
``prometheus_client``'s own parser, as node_exporter would.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from memstaged import __version__
from memstaged.core.decide import Decision
from memstaged.daemon import control_socket
from memstaged.deadletter import acks
from memstaged.files import atomic_write, safe_open
from memstaged.log import rotated_file
from memstaged.run.seen_cache import STAYS

if TYPE_CHECKING:
    from memstaged.daemon.loop import Daemon

#: Shortest interval between two writes of the metrics file.
MIN_INTERVAL: Final = 5.0
#: Events that say a memory dir is not watched (or cannot be worked on).
WATCH_FAILURES: Final = frozenset({"watch_failed", "memory_dir_error", "observer_died"})
_OWN: Final = ("metrics_",)


class Tally:
    """The daemon's logger, counting on the way the events the metrics need.

    Every event marks the metrics as changed (:attr:`changed`), except the metrics' own.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.repairs: Counter[str] = Counter()
        self.quarantined_candidates = 0
        self.watch_failures = 0
        self.last_decision: float | None = None
        self.changed = True  # the first write says the daemon started

    def touch(self) -> None:
        """Something the daemon did not log changed (``deadletter ack``): write again. Called
        from the control socket's thread: one assignment, read by the loop."""
        self.changed = True

    def _count(self, event: str, fields: dict[str, Any]) -> None:
        if event.startswith(_OWN):
            return
        self.changed = True
        if event in WATCH_FAILURES:
            self.watch_failures += 1
        if event != "decision" or "planned" in fields:
            return  # a decision announced then not carried out was counted when announced
        self.last_decision = time.time()
        decision = fields.get("decision")
        if decision == Decision.REPAIRED.value:
            for repair in fields.get("repairs") or []:
                if isinstance(repair, dict):
                    self.repairs[str(repair.get("rule"))] += 1
        elif decision == Decision.QUARANTINED.value:
            written = fields.get("deadletter") or []
            self.quarantined_candidates += sum(1 for n in written if "/originals/" not in n)

    def debug(self, event: str, **fields: Any) -> None:
        self._count(event, fields)
        self.inner.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._count(event, fields)
        self.inner.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._count(event, fields)
        self.inner.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._count(event, fields)
        self.inner.error(event, **fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._count(event, fields)
        self.inner.critical(event, **fields)


class Family:
    """One metric in the text format node_exporter's textfile collector reads (Prometheus's
    text exposition format, version 0.0.4): its ``# HELP`` and ``# TYPE`` lines and samples."""

    __slots__ = ("help", "kind", "name", "samples")

    def __init__(self, name: str, kind: str, help_text: str, value: float | None = None) -> None:
        #: A counter's samples are named ``<name>_total``, as the format's counters are.
        self.name = f"{name}_total" if kind == "counter" else name
        self.kind = kind
        self.help = help_text
        self.samples: list[tuple[str, float]] = []
        if value is not None:
            self.add(value)

    def add(self, value: float, **labels: str) -> None:
        pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        self.samples.append(("{" + pairs + "}" if pairs else "", value))

    def text(self) -> str:
        lines = [f"# HELP {self.name} {_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{labels} {_number(value)}" for labels, value in self.samples]
        return "\n".join(lines) + "\n"


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def collect(daemon: Daemon, tally: Tally, started: float) -> list[Family]:
    """The metrics of one daemon, read from it at each write (nothing is kept twice)."""
    decisions = Family(
        "memstaged_decisions",
        "counter",
        "Decisions this daemon made and logged since it started, by decision",
    )
    made = daemon.decisions()
    for decision in Decision:
        if decision is not Decision.DEFERRED:  # a wait, not a decision (SPEC 7, 2.1)
            decisions.add(made.get(decision.value, 0), decision=decision.value)
    seen = Family(
        "memstaged_seen_files",
        "gauge",
        "Staging files decided valid or foreign (by this daemon, an earlier one or --once) and "
        "unchanged since, as the seen cache holds them, by decision",
    )
    held = daemon.seen.held()
    for decision in Decision:
        if decision in STAYS:
            seen.add(held[decision.value], decision=decision.value)
    repairs = Family("memstaged_repairs", "counter", "Repairs applied, by rule (R1 to R6)")
    for rule, count in sorted(tally.repairs.items()):
        repairs.add(count, rule=rule)
    state = control_socket.live(daemon, started)
    waiting = sum(d.waiting + d.lock_waiting for d in state.memory_dirs)
    oldest = [d.oldest_wait_since for d in state.memory_dirs if d.oldest_wait_since]
    oldest_wait = Family(
        "memstaged_oldest_wait_timestamp_seconds",
        "gauge",
        "Last change (mtime) of the oldest waiting staging file; absent when none waits",
        min(oldest) if oldest else None,
    )
    records = unseen = 0
    for mdir in list(daemon.mdirs.values()):
        try:
            names = acks.record_names(mdir)
        except OSError:
            continue  # not listable: status says why
        records += len(names)
        unseen += acks.unseen(names, acks.load(daemon.settings.state_dir, mdir.path))
    watched = sum(1 for d in state.memory_dirs if d.watched or not d.staging_exists)
    not_watched = len(state.not_watched) + sum(
        1 for d in state.memory_dirs if d.staging_exists and not d.watched
    )
    build = Family(
        "memstaged_build_info", "gauge", "Always 1; the version of the running memstaged"
    )
    build.add(1, version=__version__)
    return [
        build,
        decisions,
        seen,
        Family(
            "memstaged_deferrals",
            "counter",
            "Times a file was deferred (a wait: settling, a lock, an error, an unwritable log)",
            daemon.counts.get(Decision.DEFERRED.value, 0),
        ),
        repairs,
        Family(
            "memstaged_quarantined_candidates",
            "counter",
            "Candidates (or whole files) moved to deadletter/",
            tally.quarantined_candidates,
        ),
        Family(
            "memstaged_waiting_files",
            "gauge",
            "Staging files waiting to be decided (settling, retried, or held by the "
            "reconciler's lock)",
            waiting,
        ),
        oldest_wait,
        Family(
            "memstaged_deadletter_records",
            "gauge",
            "Dead-letter records in the memory dirs",
            records,
        ),
        Family(
            "memstaged_deadletter_unseen_records",
            "gauge",
            "Dead-letter records not yet marked seen (memstaged deadletter ack)",
            unseen,
        ),
        Family(
            "memstaged_memory_dirs_watched", "gauge", "Memory dirs the daemon works on", watched
        ),
        Family(
            "memstaged_memory_dirs_not_watched",
            "gauge",
            "Memory dirs found but not watched (cannot be opened or watched)",
            not_watched,
        ),
        Family(
            "memstaged_watch_failures",
            "counter",
            "Failures to watch or open a memory dir, and observer deaths",
            tally.watch_failures,
        ),
        Family(
            "memstaged_log_write_failing",
            "gauge",
            "1 while the decision log file cannot be written",
            1 if state.log_failing else 0,
        ),
        Family(
            "memstaged_log_write_failures",
            "counter",
            "Events not written into the decision log file (each one's change waited, deferred)",
            rotated_file.failed_writes(),
        ),
        Family(
            "memstaged_last_decision_timestamp_seconds",
            "gauge",
            "When the last decision was logged; absent before the first",
            tally.last_decision,
        ),
        Family(
            "memstaged_start_time_seconds",
            "gauge",
            "When the daemon started, in seconds since the epoch",
            started,
        ),
        *process_families(),
    ]


def process_families() -> list[Family]:
    """The process's own figures (``memstaged_process_*``), from ``/proc/self``, named as
    node_exporter's and every Prometheus client's process metrics are."""
    import resource

    out: list[Family] = []
    try:
        fields = safe_open.read_small("/proc/self/stat").rsplit(b")", 1)[1].split()
    except OSError:
        return out  # no /proc: the daemon's own metrics are still written
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    # Fields after the command's closing parenthesis: utime and stime (11, 12), starttime (19),
    # vsize (20), rss (21), counted from 0 at the state field.
    boot = _boot_time()
    out.append(
        Family(
            "memstaged_process_cpu_seconds",
            "counter",
            "Total user and system CPU time spent in seconds.",
            (int(fields[11]) + int(fields[12])) / ticks,
        )
    )
    out.append(
        Family(
            "memstaged_process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            int(fields[20]),
        )
    )
    out.append(
        Family(
            "memstaged_process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            int(fields[21]) * page,
        )
    )
    if boot is not None:
        out.append(
            Family(
                "memstaged_process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                boot + int(fields[19]) / ticks,
            )
        )
    try:
        out.append(
            Family(
                "memstaged_process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                len(os.listdir("/proc/self/fd")),
            )
        )
    except OSError:
        pass  # a figure of the process, not of the daemon's work: left out, the rest written
    out.append(
        Family(
            "memstaged_process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
    )
    return out


def _boot_time() -> float | None:
    try:
        for line in safe_open.read_small("/proc/stat").splitlines():
            if line.startswith(b"btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def render(daemon: Daemon, tally: Tally, started: float) -> bytes:
    """The metrics file's bytes."""
    return "".join(f.text() for f in collect(daemon, tally, started)).encode("utf-8")


def write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` (``mode`` exactly, whatever the umask; temp file and
    rename: a reader sees one or the other). Raises :class:`OSError`."""
    atomic_write.replace_file(path, data, sync=False, mode=mode)


class Metrics:
    """The loop's hook: writes the metrics file when due (see the module's docstring)."""

    def __init__(
        self, daemon: Daemon, tally: Tally, clock: Callable[[], float], started: float
    ) -> None:
        self.daemon = daemon
        self.tally = tally
        self.clock = clock
        self.started = started
        self.next_write = clock()
        self.failing = False

    @property
    def path(self) -> Path | None:
        return self.daemon.settings.metrics_file  # a reload may set, move or unset it

    def tick(self) -> None:
        if self.path is None or not self.tally.changed or self.clock() < self.next_write:
            return
        self.write_now()

    def write_now(self) -> None:
        path = self.path
        if path is None:
            return
        self.tally.changed = False
        self.next_write = self.clock() + MIN_INTERVAL
        try:
            mode = self.daemon.settings.metrics_file_mode
            write(path, render(self.daemon, self.tally, self.started), mode)
        except OSError as err:
            if not self.failing:
                self.failing = True
                self.daemon.log.error(
                    "metrics_failed",
                    path=str(path),
                    error=err.strerror or str(err),
                    action="tried again after the next event",
                )
            return
        if self.failing:
            self.failing = False
            self.daemon.log.info("metrics_recovered", path=str(path))

    def deadline(self) -> float | None:
        """When the loop must wake up to write: only when something changed since."""
        if self.path is None or not self.tally.changed:
            return None
        return self.next_write

    def close(self) -> None:
        """A last write at a clean stop, so the file does not keep saying "waiting"."""
        if self.path is not None and self.tally.changed:
            self.write_now()
