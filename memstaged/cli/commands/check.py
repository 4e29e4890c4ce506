"""``memstaged check FILE...``: decide files as ``--once`` would, without touching anything.

A file is read and decided by the same code as ``memstaged status`` (:mod:`memstaged.run.preview`),
which is the daemon's: the same size limit (a file over ``max_file_size`` would be quarantined
unread), the same settle interval (a fresh file that does not parse would be deferred), links and
FIFOs skipped (opened with ``O_NOFOLLOW | O_NONBLOCK``: a FIFO never blocks it), and the same
settings (``--config``, ``MEMSTAGED_*``, the project roots of the config file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Final

import msgspec

from memstaged import config, safe_text
from memstaged.cli.commands._common import add_output_options
from memstaged.cli.commands._output import guard_verdict
from memstaged.config import Settings
from memstaged.core.decide import Context, Decision, Verdict, decide
from memstaged.core.foreign import normalize
from memstaged.core.timestamps import format_epoch_ms
from memstaged.files import fsio
from memstaged.files.memdir import MemoryDir, is_staging_name, physical_path
from memstaged.log.format import dumps
from memstaged.run.preview import decide_entry

EXIT_CODES: Final = {
    Decision.VALID.value: 0,
    Decision.DEFERRED.value: 1,
    Decision.REPAIRED.value: 3,
    Decision.QUARANTINED.value: 4,
    Decision.FOREIGN.value: 5,
    Decision.SKIPPED.value: 6,
}
#: Worst first: the exit code of several files is the worst of theirs.
_SEVERITY: Final = {0: 0, 5: 1, 3: 2, 1: 3, 4: 4, 6: 5, 2: 6}
#: What each exit code means, for --help and the man page's EXIT STATUS.
EXIT_MEANINGS: Final = (
    (0, "valid"),
    (
        1,
        "deferred: it does not parse and changed within the settle interval (still being "
        "written?), or memstaged may not read it (as --once, which leaves it for later)",
    ),
    (2, "usage error, or a file that cannot be found"),
    (3, "repairable: --once would rewrite it (--diff shows how)"),
    (4, "would be quarantined"),
    (5, "foreign: it names another project root (see --project-root)"),
    (6, "skipped: not a staging file (a link, a FIFO, a directory, a name not ending in .json)"),
)
_EPILOG: Final = """\
check decides exactly as --once (and the daemon) would with the same settings, and changes
nothing: the size limit (max_file_size), the settle interval, links and FIFOs (skipped, never
opened for reading), the project root (--project-root, the config file's project_roots, else
three levels up from the file's memory dir <project>/.pi/memory/project/staging/FILE), by its
physical path: links resolved, as the reconciler has it.

exit codes (the worst over all files):
""" + "".join(f"  {code}  {meaning}\n" for code, meaning in EXIT_MEANINGS)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "check",
        help="decide files as --once would, without touching anything",
        description="Decide staging files as --once would, and change nothing.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="staging files, or - for stdin")
    parser.add_argument(
        "--project-root",
        metavar="DIR",
        help="the project root files must name (default: the one of the file's "
        "memory dir, or the current directory for stdin)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the TOML config file (default $XDG_CONFIG_HOME/memstaged/config.toml)",
    )
    from memstaged.cli.option_types import settle_seconds

    parser.add_argument(
        "--settle",
        type=settle_seconds,
        metavar="SECONDS",
        help="how long an unparseable file must stay unchanged (default 2)",
    )
    parser.add_argument("--diff", action="store_true", help="show a repair as a diff")
    parser.add_argument("--json", action="store_true", help="one JSON line per file")
    parser.add_argument(
        "--split-invalid-candidates",
        action="store_true",
        help="decide as with split_invalid_candidates = true (repair R4)",
    )
    add_output_options(parser)
    parser.set_defaults(func=run, memory_dir=None)


def _root_for(path: str, explicit: str | None, settings: Settings) -> str:
    """The physical project root a file is compared with, as ``--once`` has it (SPEC 2.4)."""
    if explicit:
        return physical_path(normalize(os.path.abspath(explicit)))
    if path == "-":
        return normalize(os.getcwd())  # the working directory: already physical
    # <project>/.pi/memory/project/staging/<file>: the memory dir is the file's dir's parent.
    mdir = normalize(os.path.join(os.path.dirname(os.path.abspath(path)), ".."))
    return settings.project_root(mdir)[1]


def _decide_path(
    path: str, root: str, settings: Settings, clock: float
) -> tuple[str, str | None, Verdict | None, bytes | None]:
    """(decision, reason, verdict, bytes) of ``path`` as the pipeline would decide it."""
    options = settings.options
    if path == "-":
        data = sys.stdin.buffer.read()
        ctx = Context(
            project_root=root,
            file_name="stdin.json",
            source_path="-",
            split_invalid_candidates=options.split_invalid_candidates,
            decided_at=format_epoch_ms(0),
        )
        from_stdin = decide(data, ctx)
        return from_stdin.decision.value, None, from_stdin, data
    name = os.path.basename(path)
    if not is_staging_name(name):
        return Decision.SKIPPED.value, "not a staging file name (*.json, not .*)", None, None
    directory = os.path.dirname(os.path.abspath(path))
    mdir = MemoryDir(os.path.dirname(directory), root)
    dir_fd = fsio.open_dir_following(directory)
    try:
        found = decide_entry(mdir, dir_fd, name, options, clock)
    finally:
        os.close(dir_fd)
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", path)
    entry, verdict, data = found
    return entry.decision, entry.reason, verdict, data


@guard_verdict
def run(args: argparse.Namespace) -> int:
    settings = config.load(  # as --once resolves them; --project-root is check's own here
        config=args.config,
        settle=args.settle,
        split_invalid_candidates=args.split_invalid_candidates or None,
    )
    clock = time.time()
    worst = 0
    decided: list[str] = []
    for path in args.files:
        root = _root_for(path, args.project_root, settings)
        try:
            decision, reason, verdict, data = _decide_path(path, root, settings, clock)
        except OSError as err:
            print(
                f"memstaged check: {safe_text.name(path)}: {safe_text.text(err.strerror)}",
                file=sys.stderr,
            )
            worst = max(worst, 2, key=_SEVERITY.__getitem__)
            continue
        decided.append(decision)
        worst = max(worst, EXIT_CODES.get(decision, 4), key=_SEVERITY.__getitem__)
        if args.json:
            print(safe_text.json_line(dumps(_json_line(path, decision, reason, verdict))))
            continue
        _print_text(path, decision, reason, verdict, data, diff=args.diff)
        if decision == Decision.DEFERRED.value:
            print(f"  {settle_note(settings.options.settle)}")
    # Foreign files and none valid or repairable: most likely the project root is not the one
    # the files name (the shipped examples checked where the clone is), not a foreign batch.
    settled = {Decision.VALID.value, Decision.REPAIRED.value}
    if Decision.FOREIGN.value in decided and not settled & set(decided) and not args.project_root:
        roots = {_root_for(p, None, settings) for p in args.files}
        print(
            f"memstaged check: the files name another project than "
            f"{safe_text.name(', '.join(sorted(roots)))} (its project root, derived from where "
            "the file is): if that is not the project, pass --project-root DIR",
            file=sys.stderr,
        )
    return worst


def settle_note(settle: float) -> str:
    """What happens to a deferred file next: a writer that appends in pieces
    with pauses longer than ``settle`` has each piece decided apart (SPEC 5), so the line says
    which setting a slow writer needs."""
    return (
        f"would be decided once unchanged for {settle:g} seconds (settle);\n"
        "  a writer that pauses longer between pieces needs a larger settle"
    )


def _json_line(
    path: str, decision: str, reason: str | None, verdict: Verdict | None
) -> dict[str, Any]:
    if verdict is None:
        return {"path": path, "decision": decision, "reasons": [reason] if reason else []}
    return {
        "path": path,
        "decision": decision,
        "session_id": verdict.session_id,
        "sha256": verdict.sha256,
        "size": verdict.size,
        "reasons": list(verdict.reasons),
        "repairs": [msgspec.to_builtins(r) for r in verdict.repairs],
    }


def _print_text(
    path: str,
    decision: str,
    reason: str | None,
    verdict: Verdict | None,
    data: bytes | None,
    *,
    diff: bool,
) -> None:
    shown = safe_text.name(path)
    print(f"{shown}: {decision}")
    if verdict is None:
        if reason:
            print(f"  - {safe_text.text(reason)}")
        return
    for why in verdict.reasons:
        print(f"  - {safe_text.text(why)}")
    for repair in verdict.repairs:
        wrote = dumps(repair.wrote)
        print(f"  repair {repair.rule} at {safe_text.text(repair.where)}: {safe_text.text(wrote)}")
    if verdict.new_bytes is not None and data is not None:
        if diff:
            import difflib  # for --diff only: a plain check starts faster

            before = _lines(data)
            after = _lines(verdict.new_bytes)
            for line in difflib.unified_diff(before, after, shown, f"{shown} (repaired)"):
                sys.stdout.write(safe_text.text(line.rstrip("\n")) + "\n")
        else:
            print("  repaired file:")
            text = verdict.new_bytes.decode("utf-8", "replace")
            sys.stdout.write("".join(safe_text.text(line) + "\n" for line in text.splitlines()))


def _lines(data: bytes) -> list[str]:
    """Indented lines for a readable diff: both sides formatted alike, so only the repair shows."""
    body = data.removeprefix(b"\xef\xbb\xbf")
    try:
        body = msgspec.json.format(body, indent=2)
    except msgspec.DecodeError:
        body = data  # not plain JSON (exotic values): show it as it is
    text = body.decode("utf-8", "replace")
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines()]
