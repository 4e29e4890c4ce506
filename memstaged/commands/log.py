"""``memstaged log``: query the decision log, from the JSON-lines file or from journald.

Both sources yield the same event dicts (see :mod:`memstaged.logread`), and ``--json`` prints them
with their keys in one fixed order, so the two give byte-identical output for the same events.
Lifecycle events (start, lock seen, recovery, ...) are shown too unless ``--decision`` asks for
decisions only.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.text import Text

from memstaged.commands._common import (
    add_json_option,
    add_memory_dir_options,
    console,
    decision_text,
    guard_output,
    load_settings,
    local_time,
    one_line,
    parse_when,
    print_json,
    render_table,
    styled,
)
from memstaged.errors import UsageError
from memstaged.log import dumps
from memstaged.logread import (
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
from memstaged.triage import Decision

#: ``--follow`` starts with this many past events, as ``tail -f`` and ``journalctl -f`` do.
FOLLOW_HISTORY = 10
_SHOWN_ELSEWHERE = frozenset({"timestamp", "level", "event", "path", "memory_dir", "session_id"})


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "log",
        help="query the decision log",
        description="Show the decisions (and lifecycle events) memstaged logged, newest last.",
    )
    parser.add_argument(
        "--decision",
        action="append",
        metavar="DECISION",
        choices=[d.value for d in Decision],
        help="only these decisions (repeatable): " + ", ".join(d.value for d in Decision),
    )
    parser.add_argument("--since", metavar="WHEN", help="from this time on: 10m, 2h, 3d or ISO")
    parser.add_argument("--until", metavar="WHEN", help="up to this time: 10m, 2h, 3d or ISO")
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
        type=int,
        metavar="N",
        help=f"only the last N matching events (--follow: {FOLLOW_HISTORY})",
    )
    parser.add_argument(
        "--reasons", action="store_true", help="show every validation error and repair in full"
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


def open_source(args: argparse.Namespace, filt: EventFilter) -> tuple[Source, str]:
    """The source and a name for it in messages."""
    if args.journal_dir and not args.journal:
        raise UsageError("--journal-dir needs --journal")
    if args.journal:
        return JournalSource(directory=args.journal_dir, since=filt.since), "the journal"
    settings = load_settings(args)
    return FileSource(settings.log_file), str(settings.log_file)


@guard_output
def run(args: argparse.Namespace) -> int:
    if args.follow and args.until:
        raise UsageError("--follow and --until exclude each other")
    if args.lines is not None and args.lines < 0:
        raise UsageError(f"--lines {args.lines}: must be 0 or more")
    filt = build_filter(args)
    source, where = open_source(args, filt)
    try:
        events = [e for e in source.history() if filt.matches(e)]
        limit = args.lines if args.lines is not None else FOLLOW_HISTORY if args.follow else None
        if limit is not None:
            events = events[len(events) - limit :] if limit else []
        if not args.follow:
            _show(events, args)
            _warn_bad_lines(source, where)
            if not events and isinstance(source, FileSource) and not source.path.exists():
                print(f"memstaged log: no decision log at {where} yet", file=sys.stderr)
            return 0
        for event in events:
            _print_event(event, args)
        sys.stdout.flush()
        try:
            for event in source.follow(stop=lambda: False):
                if filt.matches(event):
                    _print_event(event, args)
                    sys.stdout.flush()
        except KeyboardInterrupt:
            return 0  # the normal way to end --follow
        return 0
    finally:
        source.close()


def _warn_bad_lines(source: Source, where: str) -> None:
    bad = getattr(source, "bad_lines", 0)
    if bad:
        print(
            f"memstaged log: skipped {bad} line(s) of {where} that are not JSON events",
            file=sys.stderr,
        )


# -- rendering ----------------------------------------------------------------------------------


def _show(events: list[Event], args: argparse.Namespace) -> None:
    if args.json:
        for event in events:
            print_json(ordered(event))
        return
    out = console()
    if not out.is_terminal:
        for event in events:
            _print_event(event, args)
        return
    rows = [
        [
            styled(local_time(event_time(e))),
            _kind_text(e),
            styled(str(e.get("session_id") or "")),
            styled(str(e.get("path") or "")),
            styled("\n".join(why_lines(e, full=args.reasons))),
        ]
        for e in events
    ]
    render_table(
        out,
        f"memstaged log ({len(events)} events)",
        ["time", "decision", "session", "file", "why"],
        rows,
    )


def _kind_text(event: Event) -> Text:
    if event.get("event") == "decision":
        return decision_text(str(event.get("decision")))
    return styled(str(event.get("event", "?")), "dim")


def _print_event(event: Event, args: argparse.Namespace) -> None:
    if args.json:
        print_json(ordered(event))
        return
    print(event_line(event, full=args.reasons))


def event_line(event: Event, *, full: bool = False) -> str:
    """One event as plain text: time, decision, file, session, then why (indented when full)."""
    when = local_time(event_time(event))
    if event.get("event") == "decision":
        head = f"{when}  {event.get('decision', '?'):<11}  {event.get('path', '')}"
    else:
        head = f"{when}  {event.get('event', '?'):<11}  {event.get('path', '')}".rstrip()
    session = event.get("session_id")
    if session:
        head += f"  session={session}"
    lines = why_lines(event, full=full)
    if not full:
        return f"{head}  {lines[0]}" if lines else head
    return "\n".join([head, *(f"    {line}" for line in lines)])


def why_lines(event: Event, *, full: bool) -> list[str]:
    """The reasons, repairs and dead-letter files of a decision; the fields of other events."""
    if event.get("event") != "decision":
        extras = [
            f"{key}={_short(value)}" for key, value in event.items() if key not in _SHOWN_ELSEWHERE
        ]
        return [", ".join(extras)] if extras else []
    reasons = [str(r) for r in event.get("reasons") or []]
    repairs = [
        f"repair {r.get('rule')} at {r.get('where')}: {_short(r.get('wrote'), full)}"
        for r in event.get("repairs") or []
        if isinstance(r, dict)
    ]
    deadletter = [str(d) for d in event.get("deadletter") or []]
    if not full:
        first = reasons[0] if reasons else (repairs[0] if repairs else "")
        more = len(reasons) + len(repairs) - 1 if first else 0
        return [one_line(first) + (f" (+{more} more)" if more > 0 else "")] if first else []
    lines = [f"- {r}" for r in reasons] + repairs
    if deadletter:
        lines.append("deadletter: " + ", ".join(deadletter))
    return lines


def _short(value: Any, full: bool = False) -> str:
    text = value if isinstance(value, str) else dumps(value)
    return text if full else one_line(text, 80)
