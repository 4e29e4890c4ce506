"""``memstaged log``: query the decision log, from the JSON-lines file or from journald.

Both sources yield the same event dicts (see :mod:`memstaged.log.reader`), and ``--json`` prints
them with their keys in one fixed order, so the two give byte-identical output for the same events.
Lifecycle events (start, lock seen, recovery, ...) are shown too unless ``--decision`` asks for
decisions only.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
from collections.abc import Iterator
from typing import Any

from memstaged import safe_text
from memstaged.cli.commands._common import (
    ProjectLabels,
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    load_settings,
    local_time,
    parse_when,
    within,
)
from memstaged.cli.commands._output import (
    DECISION_STYLES,
    Output,
    guard_output,
    one_line,
    plural,
)
from memstaged.cli.option_types import count
from memstaged.core import reasons
from memstaged.core.decide import Decision
from memstaged.errors import ConfigError, UsageError
from memstaged.log.format import dumps
from memstaged.log.reader import (
    Event,
    EventFilter,
    FileSource,
    JournalSource,
    Source,
    event_time,
    memory_dir_pattern,
    ordered,
    path_pattern,
)

#: ``--follow`` starts with this many past events, as ``tail -f`` and ``journalctl -f`` do.
FOLLOW_HISTORY = 10
#: What a look at memstaged's own rewrite says (SPEC 1 and 7): no decision of its own.
OWN_REWRITE = "memstaged's own rewrite, looked at again: valid (not a new decision)"
#: How many repairs the one-line form names before "(+N more)".
SHOWN_REPAIRS = 3
_SHOWN_ELSEWHERE = frozenset(
    {"timestamp", "level", "event", "path", "memory_dir", "session_id", "dry_run"}
)
_WHEN_HELP = "today, yesterday, 10m, 2h, 3d or an ISO time (local unless it has an offset)"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "log",
        help="query the decision log",
        description="Show the decisions (and lifecycle events) memstaged logged, one line "
        "each, oldest first (newest first with --reverse), through a pager on a terminal. "
        "Decisions of a --dry-run are marked (dry run): they were not carried out.",
    )
    parser.add_argument(
        "--decision",
        action="append",
        metavar="DECISION",
        choices=[d.value for d in Decision],
        help="only these decisions (repeatable): "
        + ", ".join(d.value for d in Decision)
        + "; quarantined also finds the repaired files whose invalid candidates went to "
        "deadletter/ (R4)",
    )
    parser.add_argument("-S", "--since", metavar="WHEN", help=f"from this time on: {_WHEN_HELP}")
    parser.add_argument("-U", "--until", metavar="WHEN", help=f"up to this time: {_WHEN_HELP}")
    parser.add_argument(
        "--path", metavar="GLOB", help="staging files whose path or file name matches"
    )
    parser.add_argument("--session", metavar="GLOB", help="only this session_id (glob)")
    add_memory_dir_options(parser)
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new events as they arrive (Ctrl-C ends)",
    )
    parser.add_argument(
        "-n",
        "--lines",
        type=count,
        metavar="N",
        help=f"only the last N matching events (--follow: {FOLLOW_HISTORY})",
    )
    parser.add_argument(
        "-r",
        "--reverse",
        action="store_true",
        help="newest first (not with --follow)",
    )
    parser.add_argument(
        "--reasons", action="store_true", help="show every validation error and repair in full"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="name files and memory dirs by their full paths, not by project and file name",
    )
    parser.add_argument(
        "--journal",
        action="store_true",
        help="read journald (SYSLOG_IDENTIFIER=memstaged) instead of the file",
    )
    parser.add_argument(
        "--journal-dir",
        metavar="DIR",
        help="with --journal: read the journal files in DIR (journalctl -D)",
    )
    add_json_option(parser)
    add_output_options(parser, pager=True)
    parser.set_defaults(func=run)


def build_filter(args: argparse.Namespace) -> EventFilter:
    """The filter the options describe; bad times are a usage error (exit 2)."""
    dirs = getattr(args, "memory_dir", None) or []
    return EventFilter(
        decisions=frozenset(args.decision or ()),
        since=parse_when(args.since, "--since") if args.since else None,
        until=parse_when(args.until, "--until") if args.until else None,
        path=path_pattern(args.path) if args.path else None,
        session=args.session,
        memory_dirs=tuple(memory_dir_pattern(d) for d in dirs),
    )


def project_labels(args: argparse.Namespace) -> ProjectLabels | None:
    """The short project labels, told apart among the configured memory dirs from the start;
    ``None`` with ``--full`` (or ``--json``, which keeps every path as logged)."""
    if args.full or args.json:
        return None
    try:
        known = [m.path for m in load_settings(args, lenient=True).memory_dirs()]
    except ConfigError:
        known = []  # the log names its memory dirs: labels are made as they are met
    return ProjectLabels(known)


def open_source(args: argparse.Namespace, filt: EventFilter) -> tuple[Source, str]:
    """The source and a name for it in messages."""
    if args.journal_dir and not args.journal:
        raise UsageError("--journal-dir needs --journal")
    if args.journal:
        return JournalSource(directory=args.journal_dir, since=filt.since), "the journal"
    settings = load_settings(args, lenient=True)
    return FileSource(settings.log_file), str(settings.log_file)


@guard_output
def run(args: argparse.Namespace) -> int:
    if args.follow and args.until:
        raise UsageError("--follow and --until exclude each other")
    if args.follow and args.reverse:
        raise UsageError("--follow and --reverse exclude each other")
    filt = build_filter(args)
    source, where = open_source(args, filt)
    labels = project_labels(args)
    shown = -1  # unknown: the reader quit the pager before the end
    try:
        with Output(args, paged=not args.follow) as out:
            shown = _history(source, filt, args, out, labels)
        _warn_bad_lines(source, where)
        if not args.follow:
            if not shown and isinstance(source, FileSource) and not source.path.exists():
                print(f"memstaged log: no decision log at {where} yet", file=sys.stderr)
            return 0
        render = Renderer(out, full=args.reasons, as_json=args.json, labels=labels)
        try:
            for event in source.follow(stop=lambda: False):
                if filt.matches(event):
                    out.write(render(event))
                    out.stream.flush()
        except KeyboardInterrupt:
            return 0  # the normal way to end --follow
        return 0
    finally:
        source.close()


def _history(
    source: Source,
    filt: EventFilter,
    args: argparse.Namespace,
    out: Output,
    labels: ProjectLabels | None,
) -> int:
    """Print the matching events there are now, one at a time as they are read; their count."""
    events = source.iter_reverse() if args.reverse else source.iter_history()
    matching: Iterator[Event] = (e for e in events if filt.matches(e))
    limit = args.lines if args.lines is not None else FOLLOW_HISTORY if args.follow else None
    if limit is not None:
        if args.reverse:
            matching = itertools.islice(matching, limit)
        else:  # the last N: every event is read, N are kept
            kept = collections.deque(matching, maxlen=limit) if limit else ()
            matching = iter(kept)
    render = Renderer(out, full=args.reasons, as_json=args.json, labels=labels)
    count = 0
    write = out.write
    for event in matching:
        write(render(event))
        count += 1
    if args.follow:
        for _ in matching:
            pass  # reach the end of the file, where follow() goes on
        out.stream.flush()
    return count


def _warn_bad_lines(source: Source, where: str) -> None:
    bad = getattr(source, "bad_lines", 0)
    if bad:
        print(
            f"memstaged log: skipped {plural(bad, 'line')} of {where} that "
            f"{'is not a JSON event' if bad == 1 else 'are not JSON events'}",
            file=sys.stderr,
        )


# -- rendering ----------------------------------------------------------------------------------


class Renderer:
    """One event as its line (or lines, with ``--reasons``), newline included.

    journalctl's shape: time, what, the project and file, then why, then the session. This is
    the log's hot loop (100,000 events/s into a pipe), so what repeats is
    worked out once: the local time of each second of the log, each decision's padded, coloured
    label, and each memory dir's project label.
    """

    def __init__(
        self,
        out: Output,
        *,
        full: bool = False,
        as_json: bool = False,
        labels: ProjectLabels | None = None,
    ) -> None:
        self.out = out
        self.full = full
        self.as_json = as_json
        self.labels = labels
        self._times: dict[str, str] = {}
        self._labels: dict[tuple[object, object, bool], str] = {}

    def __call__(self, event: Event) -> str:
        if self.as_json:
            return safe_text.json_line(dumps(ordered(event))) + "\n"
        kind = event.get("event")
        decision = event.get("decision") if kind == "decision" else None
        key = (kind, decision, bool(event.get("dry_run")))
        label = self._labels.get(key)
        if label is None:
            if len(self._labels) > 256:
                self._labels.clear()
            label = self._labels[key] = _label(event, self.out)
        return _line(event, self._when(event), label, self.full, self.labels) + "\n"

    def _when(self, event: Event) -> str:
        stamp = event.get("timestamp")
        if not isinstance(stamp, str):
            return local_time(None)
        second = stamp[:19] + stamp[-1:]  # the microseconds never change the second shown
        shown = self._times.get(second)
        if shown is None:
            if len(self._times) > 4096:
                self._times.clear()
            shown = self._times[second] = local_time(event_time(event))
        return shown


def _kind(event: Event) -> tuple[str, str | None]:
    """The word in the decision column and its colour: a dry run's decision is marked."""
    if event.get("event") == "decision":
        word = str(event.get("decision", "?"))
        label = f"{word} (dry run)" if event.get("dry_run") else word
        return label, DECISION_STYLES.get(word)
    return str(event.get("event", "?")), "dim"


def _label(event: Event, out: Output | None) -> str:
    """The decision column: the word, padded, escaped, coloured when colour is on."""
    word, style = _kind(event)
    label = f"{safe_text.text(word):<11}"
    return out.paint(label, style) if out is not None else label


def _line(
    event: Event, when: str, label: str, full: bool, labels: ProjectLabels | None = None
) -> str:
    """One event as text: time, decision, project and file (full path without ``labels``),
    why (indented lines when full), then the session. Every part that came from a file is
    escaped: a name with a newline cannot fake a second event, nor an ESC colour the terminal."""
    head = f"{when}  {label}"
    path = event.get("path")
    mdir = event.get("memory_dir")
    if labels is not None and isinstance(mdir, str):
        # What a person needs first at 80 columns: the project and the file's own name.
        head += "  " + safe_text.name(labels(mdir))
        name = within(path, mdir) if isinstance(path, str) else None
        if name is not None:
            head += "  " + safe_text.name(name)
        elif path:
            head += "  " + safe_text.name(path)
    elif path:
        head += "  " + safe_text.name(path)
    elif labels is None and isinstance(mdir, str) and event.get("event") != "decision":
        head += "  " + safe_text.name(mdir)  # --full: a lifecycle line names its memory dir too
    session = event.get("session_id")
    tail = "  session=" + safe_text.name(session) if session else ""
    if not full:
        why = _why(event)
        return f"{head}  {why}{tail}" if why else head + tail
    return "\n".join([head + tail, *(f"    {line}" for line in why_lines(event, full=True))])


def _why(event: Event) -> str:
    """The one-line tail: a decision's repairs by rule (which say what was done; the errors
    they fixed are in ``--reasons``) or its first reason; another event's fields."""
    if event.get("event") != "decision":
        return ", ".join(
            f"{key}={_short(value)}"
            for key, value in event.items()
            if key not in _SHOWN_ELSEWHERE and value is not None  # "abandoned=null" says nothing
        )
    if event.get("own_rewrite"):
        return OWN_REWRITE
    repairs = event.get("repairs")
    if repairs:
        return "repaired by " + safe_text.repairs(
            [r for r in repairs if isinstance(r, dict)], SHOWN_REPAIRS
        )
    left, fixed = reasons.of_event(event)  # what made a file irreparable comes first
    shown = [*left, *fixed]
    if not shown:
        return ""
    first = one_line(shown[0])
    if len(shown) == 1:
        return first
    more = f"+{len(shown) - 1} more"
    if fixed and left:
        more += f", {len(fixed)} repairable"
    return f"{first} ({more})"


def why_lines(event: Event, *, full: bool) -> list[str]:
    """The reasons, repairs and dead-letter files of a decision; the fields of other events:
    the one-line tail (``full=False``), or every one of them, a line each."""
    if not full:
        why = _why(event)
        return [why] if why else []
    if event.get("event") != "decision":
        return why_lines(event, full=False)
    left, fixed = reasons.of_event(event)
    repairs = [r for r in event.get("repairs") or [] if isinstance(r, dict)]
    deadletter = [str(d) for d in event.get("deadletter") or []]
    lines = [f"- {one_line(r)}" for r in left]
    lines += [f"- {one_line(r)} (a repair would fix this one)" for r in fixed]
    lines += [
        f"repair {safe_text.text(r.get('rule'))} at {safe_text.text(r.get('where'))}: "
        f"{_short(r.get('wrote'), True)}"
        for r in repairs
    ]
    if deadletter:
        lines.append("deadletter: " + ", ".join(safe_text.name(d) for d in deadletter))
    return lines


def _short(value: Any, full: bool = False) -> str:
    text = value if isinstance(value, str) else dumps(value)
    return safe_text.text(text) if full else one_line(text, 80)
