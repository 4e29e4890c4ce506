"""``memstaged status``: per memory dir, what is waiting, what failed, who is at work.

Read-only (see :mod:`memstaged.survey`). Exit 0 when nothing needs attention and 1 otherwise, so
it serves as a health check (a systemd ``ExecCondition``, a monitoring probe, a cron mail).
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from memstaged import display
from memstaged.commands import _common
from memstaged.commands._common import (
    DECISION_STYLES,
    Output,
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    guard_verdict,
    human_age,
    load_settings,
    memory_dirs,
    one_line,
    parse_duration,
    print_json,
    render_table,
)
from memstaged.survey import OUTCOMES, DirStatus, survey


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="per memory dir: staging files, dead letters, locks; exit 1 if something needs care",
        description="Look at each memory dir without changing anything. Exit 0 when nothing "
        "needs attention, 1 otherwise.",
    )
    add_memory_dir_options(parser, triage=True)
    parser.add_argument(
        "--grace",
        default="60s",
        metavar="DURATION",
        help="a file not yet repaired or quarantined needs attention only once "
        "it is this old: the daemon may be at it (default 60s)",
    )
    parser.add_argument(
        "--max-age",
        metavar="DURATION",
        help="also flag a memory dir whose oldest staging file is older",
    )
    parser.add_argument(
        "--require-daemon",
        action="store_true",
        help="flag a memory dir no memstaged daemon is running on",
    )
    parser.add_argument(
        "--files",
        action="store_true",
        help="list every staging file with the decision it would get",
    )
    add_json_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


@guard_verdict
def run(args: argparse.Namespace) -> int:
    grace = parse_duration(args.grace, "--grace")
    max_age = parse_duration(args.max_age, "--max-age") if args.max_age is not None else None
    settings = load_settings(args)
    mdirs = memory_dirs(settings, writable=False)
    clock = _common.now()
    results = [
        survey(
            m,
            settings.options,
            clock=clock,
            grace=grace,
            max_age=max_age,
            require_daemon=args.require_daemon,
        )
        for m in mdirs
    ]
    if args.json:
        for result in results:
            print_json(msgspec.to_builtins(result))
    else:
        with Output(args) as out:
            _render(results, out, files=args.files)
    return 1 if any(r.attention for r in results) else 0


def _render(results: list[DirStatus], out: Output, *, files: bool) -> None:
    """One two-column table per memory dir: what, and how it stands."""
    for r in results:
        counts = [
            [f"  would be {o}" if o != "unreadable" else "  cannot be read", str(r.staging[o])]
            for o in OUTCOMES
            if r.staging[o] or o in ("valid", "repaired", "quarantined")
        ]
        rows = [
            ["staging files", str(r.staging["total"])],
            *counts,
            ["oldest staging file", _oldest_text(r)],
            ["dead-letter records", str(r.deadletter_records)],
            ["dead-letter originals", str(r.deadletter_originals)],
            ["reconciler lock", _lock_text(r)],
            ["memstaged", _holder_text(r)],
            ["needs attention", "yes" if r.attention else "no"],
        ]
        styles: list[list[str | None]] = [[None, None] for _ in rows]
        styles[-1][1] = "yellow" if r.attention else "green"
        render_table(out, display.name(r.memory_dir), ["", "now"], rows, styles=styles)
    for r in results:
        if files and r.files:
            render_table(
                out,
                f"{display.name(r.memory_dir)}/staging",
                ["file", "would be", "age", "why"],
                [
                    [
                        display.name(e.name),
                        e.decision,
                        human_age(None if e.mtime is None else _age(e.mtime)),
                        one_line(e.reason or ""),
                    ]
                    for e in r.files
                ],
                styles=[[None, DECISION_STYLES.get(e.decision), None, None] for e in r.files],
            )
    flagged = [(r, a) for r in results for a in r.attention]
    if not flagged:
        out.write("nothing needs attention\n")
        return
    for r, item in flagged:
        line = f"needs attention: {display.name(r.memory_dir)}: {display.text(item)}"
        out.write(out.paint(line, "yellow") + "\n")


def _age(mtime: float) -> float:
    return _common.now() - mtime


def _oldest_text(r: DirStatus) -> str:
    if r.oldest_file is None:
        return "-"
    return f"{display.name(r.oldest_file)} ({human_age(r.oldest_age_seconds)})"


def _lock_text(r: DirStatus) -> str:
    lock = r.canonical_lock
    if lock is None:
        return "free"
    who = f"pid {lock['pid']}" if lock["pid"] is not None else "an unnamed holder"
    who += f" ({lock['owner']})" if lock.get("owner") else ""
    return f"held by {who}" if lock["alive"] else f"stale: {who} is gone"


def _holder_text(r: DirStatus) -> str:
    if r.memstaged_pid is None:
        return "none running"
    return f"{r.memstaged_kind} (pid {r.memstaged_pid})"
