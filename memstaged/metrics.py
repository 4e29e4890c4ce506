"""OpenMetrics/Prometheus metrics in a file, for node_exporter's textfile collector (issue 21
item 7).

With ``metrics_file`` set, the daemon writes its metrics there in the text format
``prometheus_client`` writes (and node_exporter's textfile collector reads), atomically: a temp
file beside it (``.<name>.<pid>.tmp``, which the collector ignores: it reads ``*.prom``), mode
0600, then a rename. It is written from the work loop, only after something happened (an event
was logged, or ``deadletter ack`` said that marks changed), and at most every
:data:`MIN_INTERVAL` seconds: an idle daemon writes nothing and sets no timer. Ages are given as
timestamps (the oldest wait, the last decision), so that a file written once stays true while
nothing happens; an alert computes ``time() - …``.

The counts come from the daemon's own state (decisions by decision, files waiting, memory dirs
watched) and from :class:`Tally`, which sees every event the daemon logs (repairs by rule,
quarantined candidates, watch failures, the last decision); the log file's failed writes
are counted by the log itself (:func:`memstaged.logfile.failed_writes`), across reloads.
``prometheus_client`` is imported
only when a metrics file is configured.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from memstaged import acks, control, fsio, logfile
from memstaged.triage import Decision

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from memstaged.daemon import Daemon

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


class Collector:
    """The metrics of one daemon, read from it at each write (a ``prometheus_client`` custom
    collector: nothing is kept twice)."""

    def __init__(self, daemon: Daemon, tally: Tally, started: float) -> None:
        self.daemon = daemon
        self.tally = tally
        self.started = started

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        daemon, tally = self.daemon, self.tally
        decisions = CounterMetricFamily(
            "memstaged_decisions",
            "Files decided since the daemon started, by decision",
            labels=["decision"],
        )
        for decision in Decision:
            if decision is not Decision.DEFERRED:  # a wait, not a decision (SPEC 7, 2.1)
                decisions.add_metric([decision.value], daemon.counts.get(decision.value, 0))
        yield decisions
        yield CounterMetricFamily(
            "memstaged_deferrals",
            "Times a file was deferred (a wait: settling, a lock, an error, an unwritable log)",
            value=daemon.counts.get(Decision.DEFERRED.value, 0),
        )
        repairs = CounterMetricFamily(
            "memstaged_repairs", "Repairs applied, by rule (R1 to R5)", labels=["rule"]
        )
        for rule, count in sorted(tally.repairs.items()):
            repairs.add_metric([rule], count)
        yield repairs
        yield CounterMetricFamily(
            "memstaged_quarantined_candidates",
            "Candidates (or whole files) moved to deadletter/",
            value=tally.quarantined_candidates,
        )
        state = control.live(daemon, self.started)
        waiting = sum(d.waiting + d.lock_waiting for d in state.memory_dirs)
        yield GaugeMetricFamily(
            "memstaged_waiting_files",
            "Staging files waiting to be decided (settling, retried, or held by the "
            "reconciler's lock)",
            value=waiting,
        )
        oldest = [d.oldest_wait_since for d in state.memory_dirs if d.oldest_wait_since]
        oldest_wait = GaugeMetricFamily(
            "memstaged_oldest_wait_timestamp_seconds",
            "Last change (mtime) of the oldest waiting staging file; absent when none waits",
        )
        if oldest:
            oldest_wait.add_metric([], min(oldest))
        yield oldest_wait
        records = unseen = 0
        for mdir in list(daemon.mdirs.values()):
            try:
                names = acks.record_names(mdir)
            except OSError:
                continue  # not listable: status says why
            records += len(names)
            unseen += acks.unseen(names, acks.load(daemon.settings.state_dir, mdir.path))
        yield GaugeMetricFamily(
            "memstaged_deadletter_records", "Dead-letter records in the memory dirs", value=records
        )
        yield GaugeMetricFamily(
            "memstaged_deadletter_unseen_records",
            "Dead-letter records not yet marked seen (memstaged deadletter ack)",
            value=unseen,
        )
        watched = sum(1 for d in state.memory_dirs if d.watched or not d.staging_exists)
        yield GaugeMetricFamily(
            "memstaged_memory_dirs_watched", "Memory dirs the daemon works on", value=watched
        )
        yield GaugeMetricFamily(
            "memstaged_memory_dirs_not_watched",
            "Memory dirs found but not watched (cannot be opened or watched)",
            value=len(state.not_watched)
            + sum(1 for d in state.memory_dirs if d.staging_exists and not d.watched),
        )
        yield CounterMetricFamily(
            "memstaged_watch_failures",
            "Failures to watch or open a memory dir, and observer deaths",
            value=tally.watch_failures,
        )
        yield GaugeMetricFamily(
            "memstaged_log_write_failing",
            "1 while the decision log file cannot be written",
            value=1 if state.log_failing else 0,
        )
        yield CounterMetricFamily(
            "memstaged_log_write_failures",
            "Events not written into the decision log file (each one's change waited, deferred)",
            value=logfile.failed_writes(),
        )
        last = GaugeMetricFamily(
            "memstaged_last_decision_timestamp_seconds",
            "When the last decision was logged; absent before the first",
        )
        if tally.last_decision is not None:
            last.add_metric([], tally.last_decision)
        yield last
        yield GaugeMetricFamily(
            "memstaged_start_time_seconds",
            "When the daemon started, in seconds since the epoch",
            value=self.started,
        )


def registry(daemon: Daemon, tally: Tally, started: float) -> CollectorRegistry:
    """The daemon's metrics and its process's (``memstaged_process_*``, from ``/proc``)."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    found = CollectorRegistry(auto_describe=False)
    found.register(Collector(daemon, tally, started))
    ProcessCollector(namespace="memstaged", registry=found)
    return found


def write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (0600, temp file and rename: a reader sees one or the
    other). Raises :class:`OSError`."""
    fsio.replace_file(path, data, sync=False)


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
        self._registry: CollectorRegistry | None = None

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
        from prometheus_client import generate_latest

        self.tally.changed = False
        self.next_write = self.clock() + MIN_INTERVAL
        if self._registry is None:
            self._registry = registry(self.daemon, self.tally, self.started)
        try:
            write(path, generate_latest(self._registry))
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
