"""``memstaged status``: per memory dir, what is waiting, what failed, who is at work.

The command: its options and its output, for a terminal, as JSON, or as a monitoring plugin.
What it looks at, read-only, and what needs attention there is :mod:`memstaged.cli.health`.

Exit 0 when nothing needs attention and 1 otherwise, so it serves as a health check (a systemd
``ExecCondition``, a cron mail). ``--check`` is the check a monitor runs: a short first line with
performance data, the detail on the lines after it (long output), and the exit codes of the
Monitoring Plugins guidelines (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). It requires a running
daemon when memstaged's systemd user unit is enabled (the user manager is asked), or with
``--require-daemon``.

A memory dir held by a daemon is asked about by the daemon itself, through its control socket
(:mod:`memstaged.daemon.control_socket`): a stopped or hung daemon does not answer, and is reported
within ``--timeout``. Dead-letter records need attention until they are marked seen
(``memstaged deadletter ack``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Final

import msgspec

from memstaged import safe_text
from memstaged.cli import health
from memstaged.cli.commands import _common
from memstaged.cli.commands._common import (
    ProjectLabels,
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    human_age,
    load_settings,
    parse_duration,
    resolve_settings,
)
from memstaged.cli.commands._output import (
    DECISION_STYLES,
    Output,
    guard_verdict,
    one_line,
    plural,
    print_json,
    render_table,
)
from memstaged.cli.health import OUTCOMES, DirStatus
from memstaged.cli.option_types import count, wait_seconds
from memstaged.daemon import control_socket
from memstaged.errors import MemstagedError

#: The Monitoring Plugins exit codes (``--check``).
OK: Final = 0
WARNING: Final = 1
CRITICAL: Final = 2
UNKNOWN: Final = 3
_STATES: Final = ("OK", "WARNING", "CRITICAL", "UNKNOWN")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="per memory dir: staging files, dead letters, the daemon; exit 1 if something "
        "needs care (--check: a monitoring plugin)",
        description="Look at each memory dir without changing anything, and ask the daemon "
        "that holds it (through its control socket). Exit 0 when nothing needs attention, 1 "
        "otherwise. With --check: the Monitoring Plugins output and exit codes (0 OK, 1 "
        "WARNING, 2 CRITICAL, 3 UNKNOWN), for Nagios, Icinga, Zabbix or a systemd timer. "
        f"--check requires a running daemon when {health.UNIT} is enabled (it asks the user "
        "manager, systemctl --user, within --timeout; no user manager or no unit: not "
        "required, as when only --once is used), or with --require-daemon.",
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
        action=argparse.BooleanOptionalAction,
        default=None,
        help="flag a memory dir no memstaged daemon holds (--check: CRITICAL). --check requires "
        f"one by itself when {health.UNIT} is enabled; --no-require-daemon: never, and the "
        "user manager is not asked",
    )
    parser.add_argument(
        "--files",
        action="store_true",
        help="list every staging file with the decision it would get",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="detail",
        action="store_true",
        help="the detail of every memory dir (default: with several, one line each)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="a monitoring plugin: a short first line, the detail on the lines after it, and "
        "the Monitoring Plugins exit codes. CRITICAL: memstaged.service is enabled but stopped "
        "or failed; a daemon is required (enabled unit, --require-daemon) and none holds a "
        "memory dir; a daemon does not answer; a memory dir cannot be watched; the decision "
        "log cannot be written. WARNING: unseen dead-letter records, a file waiting longer "
        "than --max-wait, a config key left out",
    )
    parser.add_argument(
        "--max-wait",
        default="5m",
        metavar="DURATION",
        help="flag a file the daemon has held longer than this without a decision (--check: "
        "WARNING; default 5m)",
    )
    parser.add_argument(
        "--max-unseen",
        type=count,
        default=0,
        metavar="N",
        help="--check: WARNING when more than N dead-letter records are not marked seen "
        "(default 0)",
    )
    parser.add_argument(
        "--timeout",
        type=_timeout,
        default=control_socket.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long the user manager and the daemons have to answer, in all (default "
        f"{control_socket.DEFAULT_TIMEOUT:g}s)",
    )
    add_json_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


#: The longest ``--timeout``: a day (a socket's timeout cannot be much longer).
MAX_TIMEOUT: Final = 86_400


def _timeout(text: str) -> float:
    seconds = wait_seconds(text)
    if seconds <= 0 or seconds > MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_TIMEOUT} seconds, not {text!r}"
        )
    return seconds


def run(args: argparse.Namespace) -> int:
    if not args.check:
        return _run(args)
    try:
        return _check(args)
    except MemstagedError as err:  # UNKNOWN: the check itself could not run
        print(f"MEMSTAGED UNKNOWN - {safe_text.text(str(err))}")
        return UNKNOWN


@guard_verdict
def _run(args: argparse.Namespace) -> int:
    grace = parse_duration(args.grace, "--grace")
    max_age = parse_duration(args.max_age, "--max-age") if args.max_age is not None else None
    max_wait = parse_duration(args.max_wait, "--max-wait")
    # A config key left out is said on stderr with --json, else among what needs attention.
    settings = (load_settings if args.json else resolve_settings)(args, lenient=True)
    results = health.look(
        settings,
        deadline=time.monotonic() + args.timeout,
        grace=grace,
        max_age=max_age,
        max_wait=max_wait,
        require_daemon=bool(args.require_daemon),
    )
    if args.json:
        for result in results:
            print_json(msgspec.to_builtins(result))
    else:
        with Output(args) as out:
            if len(results) > 1 and not args.detail and not args.files:
                _summary(results, out)
            else:
                _render(results, out, files=args.files)
            _config_attention(settings.warnings, out, flagged=any(r.attention for r in results))
    return 1 if settings.warnings or any(r.attention for r in results) else 0


def _check(args: argparse.Namespace) -> int:
    """``--check``: the Monitoring Plugins output and exit code.

    A daemon is required when ``--require-daemon`` says so, or when memstaged's user unit is
    enabled (a daemon is meant to run): an enabled unit that is not running is CRITICAL with
    the manager's reason (stopped, failed), and a memory dir no daemon holds too. Without a
    unit, or without a user manager to ask, no daemon is required (``--once`` alone is used)."""
    max_wait = parse_duration(args.max_wait, "--max-wait")
    max_age = parse_duration(args.max_age, "--max-age") if args.max_age is not None else None
    settings = resolve_settings(args, lenient=True)  # a key left out is a WARNING below
    # the manager and the daemons share --timeout; a manager that hangs takes half at most,
    # so that it cannot leave the daemons no time and make them look hung
    deadline = time.monotonic() + args.timeout
    unit = None if args.require_daemon is False else health.service(args.timeout / 2)
    down = unit.problem() if unit is not None and unit.enabled else None
    require = (bool(args.require_daemon) or (unit is not None and unit.enabled)) and not down
    results = health.look(
        settings,
        deadline=deadline,
        grace=max_wait,
        max_age=max_age,
        max_wait=max_wait,
        require_daemon=require,
    )
    text, code = check_line(
        results,
        max_unseen=args.max_unseen,
        max_wait=max_wait,
        service_down=down,
        config_warnings=settings.warnings,
    )
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        return code  # the reader left: the code still says it
    except (OSError, ValueError):
        return UNKNOWN  # the check's output was lost (main says why): the check failed
    return code


def check_line(
    results: list[DirStatus],
    *,
    max_unseen: int,
    max_wait: float,
    service_down: str | None = None,
    config_warnings: tuple[str, ...] = (),
) -> tuple[str, int]:
    """``MEMSTAGED <STATE> - <summary> | <perfdata>``, then one line per problem (the long
    output of the Monitoring Plugins guidelines), and the exit code.

    The summary stays short however many memory dirs there are: a single problem is named as
    it is; otherwise the service's state and the count of config keys left out come first,
    then, with one memory dir, its first problem (``(+N more)``), and with several, how many
    need attention (``2 of 3 memory dirs need attention``). The lines after it name every
    problem, each memory dir's with its path."""
    critical = [(r, item) for r in results for item in r.critical]
    unseen = sum(r.deadletter_unseen for r in results)
    over = unseen > max_unseen
    warnings = [
        (r, item)
        for r in results
        for item in r.attention
        if item not in r.critical and (health.UNSEEN not in item or (over and len(results) > 1))
    ]
    general = [service_down] if service_down else []
    general += [f"config {w}" for w in config_warnings]
    mine = [f"{safe_text.name(r.memory_dir)}: {item}" for r, item in critical]
    if over and len(results) == 1:  # with several, each memory dir's count is among warnings
        mine.append(
            f"{plural(unseen, 'dead-letter record')} not yet seen (memstaged deadletter list, "
            "then deadletter ack)"
        )
    mine += [f"{safe_text.name(r.memory_dir)}: {item}" for r, item in warnings]
    if critical or service_down:
        code = CRITICAL
    elif over or warnings or config_warnings:
        code = WARNING
    else:
        code = OK
    lines = [safe_text.text(p) for p in [*general, *mine]]
    flagged = len({id(r) for r, _ in [*critical, *warnings]})
    if len(lines) == 1:
        summary = lines[0]
    else:
        parts = [safe_text.text(service_down)] if service_down else []
        if config_warnings:
            keys = plural(len(config_warnings), "config key")
            parts.append(f"{keys} left out (memstaged config check)")
        if mine and len(results) == 1:
            more = f" (+{len(mine) - 1} more)" if len(mine) > 1 else ""
            parts.append(safe_text.text(mine[0]) + more)
        elif mine:
            need = "needs" if flagged == 1 else "need"
            parts.append(f"{flagged} of {plural(len(results), 'memory dir')} {need} attention")
        summary = (
            "; ".join(parts) or f"{plural(len(results), 'memory dir')}, nothing needs attention"
        )
    waits = [r.oldest_wait_seconds for r in results if r.oldest_wait_seconds is not None]
    silent = sum(1 for r in results if r.daemon_answered is False)
    perf = [
        f"memory_dirs={len(results)};;;0",
        f"unseen={unseen};{max_unseen};;0",
        f"deadletter_records={sum(r.deadletter_records for r in results)};;;0",
        f"waiting={sum(r.waiting or 0 for r in results)};;;0",
        f"oldest_wait={round(max(waits, default=0.0), 3)}s;{max_wait:g};;0",
        f"not_answering={silent};;0;0",
        f"critical={len(critical) + (1 if service_down else 0)};;0;0",
    ]
    head = f"MEMSTAGED {_STATES[code]} - {summary} | {' '.join(perf)}"
    detail = lines if len(lines) > 1 or (lines and summary != lines[0]) else []
    return "\n".join([head, *detail]), code


#: The summary's columns, one row per memory dir (its header line, tab-separated off a terminal,
#: is what scripts cut on).
SUMMARY_COLUMNS: Final = (
    "memory dir",
    "staging",
    "waiting",
    "oldest wait",
    "dead letters",
    "unseen",
    "memstaged",
    "state",
)


#: The same columns on a terminal, where each row must fit in 80 columns (#: 1,000 memory dirs
#: readable): the project's short label (as ``log`` shows it), shorter headings, and the daemon's
#: pid without words around it.
TERMINAL_COLUMNS: Final = (
    "project",
    "files",
    "waiting",
    "oldest",
    "dead",
    "unseen",
    "memstaged",
    "state",
)
#: The narrowest project label cut to fit: a few characters of its end still tell it apart.
_LABEL_MIN: Final = 8


def _terminal_width(out: Output) -> int:
    """The terminal's width; 80 when it does not say (a terminal of zero columns, say)."""
    try:
        return os.get_terminal_size(out.stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80


def _fit_labels(rows: list[list[str]], width: int) -> None:
    """Cut the labels (the first cell) that would make a row wider than ``width``, from the
    left (``…tail``): the end of a project's path is what tells it apart."""
    table = [list(TERMINAL_COLUMNS), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(1, len(TERMINAL_COLUMNS))]
    room = max(width - sum(widths) - 2 * (len(TERMINAL_COLUMNS) - 1), _LABEL_MIN)
    for row in rows:
        label = row[0]
        if len(label) > room:
            row[0] = "…" + label[-(room - 1) :]


def _summary(results: list[DirStatus], out: Output) -> None:
    """One line per memory dir: 1,000 of them stay readable (``-v`` for the detail). Off a
    terminal each row names its memory dir in full (what scripts cut on); on one, its project's
    short label, so that a row fits the terminal's width."""
    labels = ProjectLabels(r.memory_dir for r in results) if out.terminal else None
    rows = []
    styles: list[list[str | None]] = []
    for r in results:
        state = "critical" if r.critical else "attention" if r.attention else "ok"
        if labels is None:
            name, holder = safe_text.name(r.memory_dir), _holder_text(r)
        else:
            name = safe_text.text(labels(r.memory_dir))
            holder = "none" if r.memstaged_pid is None else f"{r.memstaged_kind} {r.memstaged_pid}"
        rows.append(
            [
                name,
                str(r.staging["total"]),
                "-" if r.waiting is None else str(r.waiting),
                human_age(r.oldest_wait_seconds) if r.oldest_wait_seconds is not None else "-",
                str(r.deadletter_records),
                str(r.deadletter_unseen),
                holder,
                state,
            ]
        )
        colour = {"ok": "green", "attention": "yellow", "critical": "red"}[state]
        styles.append([None] * 7 + [colour])
    columns = SUMMARY_COLUMNS
    if labels is not None:
        columns = TERMINAL_COLUMNS
        _fit_labels(rows, _terminal_width(out))
    render_table(
        out,
        f"{len(results)} memory dirs",
        list(columns),
        rows,
        right=[
            "staging",
            "files",
            "waiting",
            "oldest wait",
            "oldest",
            "dead letters",
            "dead",
            "unseen",
        ],
        styles=styles,
    )
    flagged = sum(1 for r in results if r.attention)
    if not flagged:
        return
    need = "needs" if flagged == 1 else "need"
    line = f"{flagged} of {len(results)} memory dirs {need} attention: memstaged status -v"
    out.write(out.paint(line, "yellow") + "\n")


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
            ["  not yet seen", str(r.deadletter_unseen)],
            ["dead-letter originals", str(r.deadletter_originals)],
            ["reconciler lock", _lock_text(r)],
            ["memstaged", _holder_text(r)],
            *_daemon_rows(r),
            ["needs attention", "yes" if r.attention else "no"],
        ]
        styles: list[list[str | None]] = [[None, None] for _ in rows]
        styles[-1][1] = "red" if r.critical else "yellow" if r.attention else "green"
        render_table(out, safe_text.name(r.memory_dir), ["", "now"], rows, styles=styles)
    for r in results:
        if files and r.files:
            render_table(
                out,
                f"{safe_text.name(r.memory_dir)}/staging",
                ["file", "would be", "age", "why"],
                [
                    [
                        safe_text.name(e.name),
                        e.decision,
                        human_age(None if e.mtime is None else _age(e.mtime)),
                        one_line(e.reason or ""),
                    ]
                    for e in r.files
                ],
                styles=[[None, DECISION_STYLES.get(e.decision), None, None] for e in r.files],
            )
    for r in results:
        for item in r.attention:
            line = f"needs attention: {safe_text.name(r.memory_dir)}: {safe_text.text(item)}"
            out.write(out.paint(line, "yellow") + "\n")


def _config_attention(warnings: tuple[str, ...], out: Output, *, flagged: bool) -> None:
    """The config keys left out (a key the daemon's next reload would refuse) need attention
    too; ``nothing needs attention`` closes the output when nothing does."""
    for warning in warnings:
        out.write(out.paint(f"needs attention: config {safe_text.text(warning)}", "yellow") + "\n")
    if not warnings and not flagged:
        out.write("nothing needs attention\n")


def _age(mtime: float) -> float:
    return _common.now() - mtime


def _oldest_text(r: DirStatus) -> str:
    if r.oldest_file is None:
        return "-"
    return f"{safe_text.name(r.oldest_file)} ({human_age(r.oldest_age_seconds)})"


def _lock_text(r: DirStatus) -> str:
    lock = r.canonical_lock
    if lock is None:
        return "free"
    who = f"pid {lock['pid']}" if lock["pid"] is not None else "an unnamed holder"
    who += f" ({lock['owner']})" if lock.get("owner") else ""
    return f"held by {who}" if lock["alive"] else f"stale: {who} is gone"


def _daemon_rows(r: DirStatus) -> list[list[str]]:
    """What the daemon said (its live counts), when one holds the memory dir."""
    if r.daemon_answered is None:
        return []
    if not r.daemon_answered:
        return [["  answers", "no"]]
    return [
        ["  answers", "yes"],
        ["  says", r.daemon_status or "-"],
        ["  watches staging/", "-" if r.watched is None else "yes" if r.watched else "no"],
        ["  files waiting", "-" if r.waiting is None else str(r.waiting)],
        ["  oldest wait", human_age(r.oldest_wait_seconds)],
    ]


def _holder_text(r: DirStatus) -> str:
    if r.memstaged_pid is None:
        return "none running"
    return f"{r.memstaged_kind} (pid {r.memstaged_pid})"
