"""What ``memstaged --once`` prints: the counts of each memory dir it decided.

One line per memory dir (``path: valid=1 ... total=7 unchanged=0``) when stdout is not a
terminal, for scripts and CI logs; an aligned table on one; one JSON object per memory dir with
``--json``, and one per memory dir left undecided. A reader that goes away
(``memstaged --once | head -1``) does not change the exit code: every file was decided whether
or not the summary was read.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import IO, Any, Final

from memstaged import safe_text
from memstaged.cli.stdout import to_devnull
from memstaged.core.decide import Decision
from memstaged.run.once import LOOKS_WAITING, Report

_ORDER: Final = [d.value for d in Decision]


def _total(counts: Counter[str]) -> int:
    """The files decided or waiting (a look at memstaged's own rewrite is no file of its own)."""
    return sum(counts.get(d, 0) for d in _ORDER)


def _waiting(counts: Counter[str]) -> str:
    """`` looks_waiting=N`` when looks at memstaged's rewrites wait for the log, else nothing."""
    n = counts.get(LOOKS_WAITING, 0)
    return f" {LOOKS_WAITING}={n}" if n else ""


def print_summary(report: Report, *, as_json: bool) -> int:
    """The summary on stdout; the run's exit code (:attr:`Report.code`)."""
    out = sys.stdout
    try:
        if as_json:
            _as_json(out, report)
        elif not safe_text.is_terminal(out):
            _as_lines(out, report)
        else:
            _as_table(out, report)
        out.flush()
    except BrokenPipeError:
        to_devnull()  # `| head -1`: the reader had what it wanted; the decisions stand
    return report.code


def _as_json(out: IO[str], report: Report) -> None:
    from memstaged.log.format import dumps

    for path, counts in report.counts.items():
        summary: dict[str, Any] = {"memory_dir": path}
        summary.update((d, counts.get(d, 0)) for d in _ORDER)
        if counts.get(LOOKS_WAITING):
            summary[LOOKS_WAITING] = counts[LOOKS_WAITING]
        summary.update(
            total=_total(counts),
            unchanged=report.unchanged.get(path, 0),
            dry_run=report.dry_run,
        )
        out.write(dumps(summary) + "\n")
    for path, why in report.busy.items():
        out.write(dumps({"memory_dir": path, "busy": why, "dry_run": report.dry_run}) + "\n")


def _suffix(report: Report) -> str:
    return " (dry run: nothing written)" if report.dry_run else ""


def _as_lines(out: IO[str], report: Report) -> None:
    for path, counts in report.counts.items():
        parts = " ".join(f"{d}={counts.get(d, 0)}" for d in _ORDER)
        out.write(
            f"{safe_text.name(path)}: {parts} total={_total(counts)} "
            f"unchanged={report.unchanged.get(path, 0)}{_waiting(counts)}{_suffix(report)}\n"
        )


def _as_table(out: IO[str], report: Report) -> None:
    header = ["memory dir", *_ORDER, "total"]
    rows = [
        [safe_text.name(path), *(str(counts.get(d, 0)) for d in _ORDER), str(_total(counts))]
        for path, counts in report.counts.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out.write(f"memstaged --once{_suffix(report)}\n")
    if sum(widths) + 2 * (len(widths) - 1) > _columns(out):
        # Too wide for the terminal, where it wrapped mid-word ("to / tal" at 100 columns):
        # each memory dir on its own line, its counts under it.
        tail = widths[1:]
        out.write("  " + "  ".join(c.rjust(w) for c, w in zip(header[1:], tail, strict=True)))
        out.write("\n")
        for row in rows:
            out.write(row[0] + "\n")
            cells = [c.rjust(w) for c, w in zip(row[1:], tail, strict=True)]
            out.write("  " + "  ".join(cells) + "\n")
    else:
        for row in [header, *rows]:
            cells = [row[0].ljust(widths[0])] + [
                c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
            ]
            out.write("  ".join(cells).rstrip() + "\n")
    skipped = sum(report.unchanged.values())
    if skipped:
        out.write(f"{skipped} files unchanged since they were decided were not read again.\n")
    waiting = sum(counts.get(LOOKS_WAITING, 0) for counts in report.counts.values())
    if waiting:
        out.write(
            f"{waiting} looks at memstaged's own rewrites wait for the decision log "
            f"({LOOKS_WAITING}); the next run logs them.\n"
        )


def _columns(out: IO[str]) -> int:
    """The terminal's width; 80 when it does not say (a terminal of zero columns, say)."""
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80
