"""``memstaged stats``: what memstaged decided, where, when, why files fail, and what is stuck.

:func:`compute` is a pure function of the events, the clock and an ``exists`` check, so the counts
are tested without a log file. Counts cover the window (``--since``/``--until``); what is stuck is
judged over the whole log, since a file deferred before the window began is still stuck now.

One version of one file is one decision (SPEC 7): memstaged's look at its own
rewrite is not counted (``own_rewrite: true``; in an older log, the ``valid`` that follows a
file's ``repaired``), nor is a version decided again with the same outcome (a restart, a lost
cache, a decision logged again after a crash: the same path, bytes and decision as the file's
last decision). A ``deferred`` is a wait, not a decision: waits are counted apart, with
how long the oldest file still waiting has waited.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from memstaged import safe_text
from memstaged.cli.commands import _common
from memstaged.cli.commands._common import (
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    human_age,
    iso_utc,
    local_time,
    parse_duration,
)
from memstaged.cli.commands._output import (
    Output,
    guard_output,
    one_line,
    print_json,
    render_table,
)
from memstaged.cli.commands.log import build_filter, open_source
from memstaged.cli.option_types import count
from memstaged.core import reasons
from memstaged.core.decide import Decision
from memstaged.log.reader import Event, EventFilter, event_time

#: The decisions counted: a deferral is a wait, counted apart.
DECISIONS: Final = [d.value for d in Decision if d is not Decision.DEFERRED]
_INDEX: Final = re.compile(r"\[[0-9]+\]")
#: Reasons whose tail varies with the input (offsets, sizes): counted under their head.
#: The last two are contract v1's reasons, still found in older logs.
_HEADS: Final = ("not JSON", "file too large", "not UTF-8", "JSON nesting is too deep")


class Stuck(msgspec.Struct, frozen=True):
    """A file whose latest decisions are all ``deferred``, for longer than the threshold."""

    path: str
    memory_dir: str | None
    session_id: str | None
    deferred_since: str | None
    last_seen: str | None
    for_seconds: float
    deferrals: int
    reason: str
    exists: bool


class Waits(msgspec.Struct, frozen=True):
    """Deferrals: waits for a file to settle or for a lock, not decisions (SPEC 7)."""

    #: ``deferred`` events in the window.
    deferrals: int
    #: Files deferred at least once in the window.
    files: int
    #: Files still waiting now (deferred, never decided since, still there), and the oldest.
    waiting: int
    oldest_path: str | None
    oldest_seconds: float | None


class Stats(msgspec.Struct, frozen=True):
    since: str | None
    until: str | None
    by: str
    #: Decisions, one per version of a file: no deferral, no look at memstaged's own rewrite.
    total: int
    decisions: dict[str, int]
    #: Decisions of ``--dry-run`` runs in the window: logged, never carried out, so counted
    #: here and nowhere else (SPEC 7).
    dry_run: int
    memory_dirs: dict[str, dict[str, int]]
    periods: dict[str, dict[str, int]]
    #: The errors that dead-lettered something: a quarantine's errors no repair fixes, and the
    #: errors of candidates R4 split off.
    top_errors: list[dict[str, Any]]
    #: The repairs made, by rule and place: ``[{rule, where, count}]``.
    top_repairs: list[dict[str, Any]]
    waits: Waits
    stuck: list[Stuck]
    #: Looks at memstaged's own rewrites and repeated decisions of one version: not counted.
    not_counted: int = 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "stats",
        help="counts per decision, memory dir and day; frequent errors; stuck files",
        description="Summarize the decision log over a window. Decisions of a --dry-run are "
        "not counted as decisions (they were not carried out): they are counted apart.",
    )
    parser.add_argument(
        "-S", "--since", metavar="WHEN", help="from this time on: today, yesterday, 10m, 3d or ISO"
    )
    parser.add_argument(
        "-U", "--until", metavar="WHEN", help="up to this time: today, yesterday, 10m, 3d or ISO"
    )
    parser.add_argument(
        "--by",
        choices=["day", "hour"],
        default="day",
        help="count per day (default) or per hour, in local time",
    )
    parser.add_argument(
        "--top",
        type=count,
        default=10,
        metavar="N",
        help="how many of the most frequent errors and repairs (default 10)",
    )
    parser.add_argument(
        "--stuck-after",
        default="10m",
        metavar="DURATION",
        help="a file deferred for longer than this is stuck (default 10m)",
    )
    add_memory_dir_options(parser)
    parser.add_argument("--journal", action="store_true", help="read journald instead of the file")
    parser.add_argument(
        "--journal-dir", metavar="DIR", help="with --journal: read the journal files in DIR"
    )
    add_json_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run, decision=None, path=None, session=None)


def error_key(reason: str) -> str:
    """A validation error without its array indexes, so the same fault in many files adds up."""
    for head in _HEADS:
        if reason.startswith(head):
            return head
    return _INDEX.sub("[]", reason)


def _bucket(when: dt.datetime, by: str) -> str:
    local = when.astimezone()
    return local.strftime("%Y-%m-%d %H:00" if by == "hour" else "%Y-%m-%d")


def compute(
    events: Iterable[Event],
    *,
    window: EventFilter,
    by: str = "day",
    top: int = 10,
    stuck_after: float = 600.0,
    clock: float,
    exists: Callable[[str], bool] = os.path.lexists,
) -> Stats:
    """Count the decisions in ``window``; find files deferred for longer than ``stuck_after``."""
    everywhere = msgspec.structs.replace(window, since=None, until=None)
    decisions: Counter[str] = Counter()
    per_dir: dict[str, Counter[str]] = {}
    per_period: dict[str, Counter[str]] = {}
    errors: Counter[str] = Counter()
    repairs: Counter[tuple[str, str]] = Counter()
    streaks: dict[str, list[Event]] = {}
    last: dict[str, Event] = {}
    deferrals = 0
    deferred_files: set[str] = set()
    dry_runs = 0
    not_counted = 0
    for event in events:
        if event.get("event") != "decision" or not everywhere.matches(event):
            continue
        if event.get("dry_run"):
            dry_runs += window.matches(event)
            continue
        path, decision = str(event.get("path")), str(event.get("decision"))
        if decision == Decision.DEFERRED.value:
            streaks.setdefault(path, []).append(event)
            if window.matches(event):
                deferrals += 1
                deferred_files.add(path)
            continue
        streaks.pop(path, None)
        again = _decided_before(event, last.get(path))
        last[path] = event
        if not window.matches(event):
            continue
        if again:
            not_counted += 1
            continue
        decisions[decision] += 1
        per_dir.setdefault(str(event.get("memory_dir")), Counter())[decision] += 1
        when = event_time(event)
        if when is not None:
            per_period.setdefault(_bucket(when, by), Counter())[decision] += 1
        _count_errors(event, errors, repairs)
    stuck = _stuck(streaks, float("-inf"), clock, exists)
    waiting = [s for s in stuck if s.exists]
    return Stats(
        since=iso_utc(window.since),
        until=iso_utc(window.until),
        by=by,
        total=sum(decisions.values()),
        decisions={d: decisions.get(d, 0) for d in DECISIONS},
        dry_run=dry_runs,
        memory_dirs={k: _full(c) for k, c in sorted(per_dir.items())},
        periods={k: _full(c) for k, c in sorted(per_period.items())},
        top_errors=[{"error": e, "count": n} for e, n in errors.most_common(max(top, 0))],
        top_repairs=[
            {"rule": rule, "where": where, "count": n}
            for (rule, where), n in repairs.most_common(max(top, 0))
        ],
        waits=Waits(
            deferrals=deferrals,
            files=len(deferred_files),
            waiting=len(waiting),
            oldest_path=waiting[0].path if waiting else None,
            oldest_seconds=waiting[0].for_seconds if waiting else None,
        ),
        stuck=[s for s in stuck if s.for_seconds > stuck_after],
        not_counted=not_counted,
    )


def _decided_before(event: Event, previous: Event | None) -> bool:
    """Is ``event`` no new decision: memstaged's look at its own rewrite, or the version its
    file's last decision was about, decided the same way again?"""
    if event.get("own_rewrite"):
        return True
    if previous is None:
        return False
    decision, before = event.get("decision"), previous.get("decision")
    if before == Decision.REPAIRED.value and decision == Decision.VALID.value:
        rewrite = previous.get("rewrite_sha256")
        # An older log does not name the rewrite's bytes: the valid that follows is its look.
        return rewrite is None or rewrite == event.get("sha256")
    sha = event.get("sha256")
    return sha is not None and decision == before and sha == previous.get("sha256")


def _count_errors(event: Event, errors: Counter[str], repairs: Counter[tuple[str, str]]) -> None:
    """The errors that dead-lettered something, and the repairs made."""
    decision = event.get("decision")
    if decision == Decision.QUARANTINED.value:
        left, _fixed = reasons.of_event(event)
        errors.update(error_key(r) for r in left)
        return
    if decision != Decision.REPAIRED.value:
        return
    made = [r for r in event.get("repairs") or [] if isinstance(r, dict)]
    if any(r.get("rule") == "R4" for r in made):  # the reasons are the split candidates'
        errors.update(error_key(str(r)) for r in event.get("reasons") or [])
    repairs.update((str(r.get("rule")), error_key(str(r.get("where")))) for r in made)


def _full(counts: Counter[str]) -> dict[str, int]:
    return {d: counts.get(d, 0) for d in DECISIONS}


def _stuck(
    streaks: dict[str, list[Event]], threshold: float, clock: float, exists: Callable[[str], bool]
) -> list[Stuck]:
    out = []
    for path, streak in streaks.items():
        first, last = event_time(streak[0]), event_time(streak[-1])
        if first is None:
            continue
        age = clock - first.timestamp()
        if age <= threshold:
            continue
        why = streak[-1].get("reasons") or ["(no reason logged)"]
        out.append(
            Stuck(
                path=path,
                memory_dir=streak[-1].get("memory_dir"),
                session_id=streak[-1].get("session_id"),
                deferred_since=iso_utc(first),
                last_seen=iso_utc(last),
                for_seconds=round(age, 3),
                deferrals=len(streak),
                reason=str(why[-1]),
                exists=exists(path),
            )
        )
    return sorted(out, key=lambda s: -s.for_seconds)


@guard_output
def run(args: argparse.Namespace) -> int:
    stuck_after = parse_duration(args.stuck_after, "--stuck-after")
    filt = build_filter(args)
    source, _where = open_source(args, msgspec.structs.replace(filt, since=None))
    try:
        stats = compute(
            source.iter_history(),
            window=filt,
            by=args.by,
            top=args.top,
            stuck_after=stuck_after,
            clock=_common.now(),
        )
    finally:
        source.close()
    if args.json:
        print_json(msgspec.to_builtins(stats))
        return 0
    with Output(args) as out:
        _render(stats, out)
    return 0


def _render(stats: Stats, out: Output) -> None:
    span = f"{_when(stats.since)} .. {_when(stats.until)}"
    render_table(
        out,
        f"decisions ({span})",
        ["decision", "count"],
        [[d, str(n)] for d, n in stats.decisions.items()]
        + [
            ["total", str(stats.total)],
            ["(dry run, not carried out)", str(stats.dry_run)],
            ["(looked at again, not counted)", str(stats.not_counted)],
        ],
        right=["count"],
    )
    waits = stats.waits
    oldest = "-"
    if waits.oldest_path is not None:
        oldest = f"{human_age(waits.oldest_seconds)} ({safe_text.name(waits.oldest_path)})"
    render_table(
        out,
        "waits: deferred, not decisions",
        ["wait", "count"],
        [
            ["deferrals", str(waits.deferrals)],
            ["files deferred", str(waits.files)],
            ["still waiting", str(waits.waiting)],
            ["oldest still waiting", oldest],
        ],
        right=["count"],
    )
    short = DECISIONS
    render_table(
        out,
        "per memory dir",
        ["memory dir", *short],
        [
            [safe_text.name(k), *(str(c[d]) for d in DECISIONS)]
            for k, c in stats.memory_dirs.items()
        ],
        right=short,
    )
    render_table(
        out,
        f"per {stats.by}",
        [stats.by, *short],
        [[k, *(str(c[d]) for d in DECISIONS)] for k, c in stats.periods.items()],
        right=short,
    )
    render_table(
        out,
        "most frequent errors that caused a quarantine",
        ["count", "error"],
        [[str(e["count"]), one_line(e["error"])] for e in stats.top_errors],
        right=["count"],
    )
    render_table(
        out,
        "repairs by rule",
        ["count", "rule", "where"],
        [[str(r["count"]), r["rule"], one_line(r["where"])] for r in stats.top_repairs],
        right=["count"],
    )
    render_table(
        out,
        "stuck: deferred and never decided since",
        ["for", "deferrals", "file", "still there", "last reason"],
        [
            [
                human_age(s.for_seconds),
                str(s.deferrals),
                safe_text.name(s.path),
                "yes" if s.exists else "no",
                one_line(s.reason),
            ]
            for s in stats.stuck
        ],
        right=["for", "deferrals"],
    )


def _when(value: str | None) -> str:
    if value is None:
        return "*"
    return local_time(dt.datetime.fromisoformat(value))
