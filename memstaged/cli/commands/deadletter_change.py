"""``memstaged deadletter recover|purge``: changing the dead-letter store, beside the daemon.

``recover`` puts candidates back into ``staging/`` (see :mod:`memstaged.deadletter.recover`);
``purge`` is the only way records are ever deleted without being recovered, and without ``--yes`` it
only lists what it would delete. Both change the store only under ``canonical-writer.lock`` (which
the daemon obeys), and log what they did to the decision log: what an operator changed is on
record too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Final

import msgspec

from memstaged import safe_text
from memstaged.cli.commands import _common
from memstaged.cli.commands._common import (
    human_age,
    iso_utc,
    load_settings,
    log_same_directory,
    memory_dirs,
    parse_duration,
)
from memstaged.cli.commands._output import (
    Output,
    guard_verdict,
    one_line,
    plural,
    print_json,
    render_table,
)
from memstaged.cli.commands.deadletter_read import records_of
from memstaged.config import Alias, Settings
from memstaged.deadletter.changes import DEFAULT_WAIT, Waiter
from memstaged.deadletter.purge import plan_purge, purge
from memstaged.deadletter.recover import RecoverAction, Report, preview, recover
from memstaged.deadletter.store import RecordFile, list_originals, list_records, resolve_ids
from memstaged.errors import UsageError
from memstaged.files.memdir import MemoryDir

_ACTION_STYLES: Final = {"recovered": "green", "duplicate": "cyan", "left": "yellow"}


def _logger(settings: Settings) -> Any:
    """The decision log, for recover and purge: what an operator changed is on record too."""
    from memstaged.log.rotated_file import open_error
    from memstaged.log.writer import configure, get_logger

    try:
        configure(
            settings.log_file,
            max_bytes=settings.log_max_bytes,
            backups=settings.log_backups,
            console="off",
            quiet_file=True,  # a change the log cannot take stops the command with one line
        )
    except OSError as err:
        raise open_error(settings.log_file, err) from None
    return get_logger()


def _waiter(args: argparse.Namespace) -> Waiter:
    """``--wait`` as given here, or before the command (``memstaged --wait deadletter ...``)."""
    value = getattr(args, "wait", None)
    limit = DEFAULT_WAIT if value is True else value if isinstance(value, float) else None
    return Waiter(limit, lambda text: print(f"memstaged: {text}", file=sys.stderr, flush=True))


@guard_verdict
def run_recover(args: argparse.Namespace) -> int:
    if not (args.all or args.session or args.id):
        raise UsageError("deadletter recover: choose what to recover with --session, --id or --all")
    dry_run = getattr(args, "dry_run", False)
    settings = load_settings(args)
    aliases: list[Alias] = []
    mdirs = memory_dirs(settings, writable=not dry_run, aliases=aliases)
    wanted = _selection(args, mdirs)
    logger = None if dry_run else _logger(settings)
    if logger is not None:
        log_same_directory(logger, aliases)
    waiter = _waiter(args)
    reports: list[Report] = []
    for mdir in mdirs:
        chosen = wanted.get(mdir.path) if wanted is not None else None
        if wanted is not None and not chosen:
            continue
        if dry_run:
            reports.append(preview(mdir, chosen, settings.options, _common.now()))
            continue
        report = recover(
            mdir,
            chosen,
            options=settings.options,
            clock=_common.now(),
            waiter=waiter,
            logger=logger,
        )
        if report.busy is not None:
            print(f"memstaged: {report.busy}", file=sys.stderr)
        reports.append(report)
    _show_recovery(reports, args.json, dry_run, args)
    stays = (RecoverAction.LEFT, RecoverAction.BUSY)
    left = any(o.action in stays for r in reports for o in r.outcomes)
    return 1 if left or any(r.busy is not None for r in reports) else 0


def _selection(args: argparse.Namespace, mdirs: list[MemoryDir]) -> dict[str, set[str]] | None:
    """memory dir -> record names chosen; ``None`` for ``--all``. Bad IDs are usage errors."""
    if args.all:
        return None
    records = records_of(mdirs)
    chosen = resolve_ids(records, args.id or [])
    for session in args.session or []:
        found = [r for r in records if r.session_id == session]
        if not found:
            print(f"memstaged: no dead-letter record of session {session!r}", file=sys.stderr)
        chosen.extend(found)
    out: dict[str, set[str]] = {}
    for record in chosen:
        out.setdefault(record.memory_dir, set()).add(record.name)
    return out


def _show_recovery(
    reports: list[Report], as_json: bool, dry_run: bool, args: argparse.Namespace
) -> None:
    outcomes = sorted((o for r in reports for o in r.outcomes), key=lambda o: (o.memory_dir, o.id))
    deleted = [o for r in reports for o in r.originals_deleted]
    if as_json:
        for outcome in outcomes:
            print_json(msgspec.to_builtins(outcome))
        for name in deleted:
            print_json({"action": "original_deleted", "original": name})
        return
    out = Output(args)
    rows = [
        [
            safe_text.name(o.id),
            safe_text.name(o.session_id or "-"),
            o.category or "?",
            o.action,
            safe_text.name(o.staging_file or "-"),
            one_line(o.reason or ""),
        ]
        for o in outcomes
    ]
    styles = [[None, None, None, _ACTION_STYLES.get(o.action), None, None] for o in outcomes]
    title = "deadletter recover" + (" (dry run: nothing changed)" if dry_run else "")
    render_table(
        out,
        title,
        ["id", "session", "category", "outcome", "staging file", "why"],
        rows,
        styles=styles,
    )
    counts = {a.value: sum(o.action == a.value for o in outcomes) for a in RecoverAction}
    verb = "would be " if dry_run else ""
    summary = (
        f"{counts['recovered']} {verb}recovered, {counts['duplicate']} {verb}removed as "
        f"duplicates, {counts['left']} left in the dead-letter store"
    )
    if counts["gone"]:
        summary += f", {counts['gone']} already gone (taken meanwhile by another process)"
    busy = [r for r in reports if r.busy is not None]
    if busy:
        # Never a bare "0 left": those records were not looked at again, and are still there.
        summary += (
            f"; {counts['busy']} not tried because {plural(len(busy), 'memory dir')} "
            f"{'was' if len(busy) == 1 else 'were'} busy "
            "(canonical-writer.lock held; see above): still in the dead-letter store"
        )
    if deleted:
        were = "was" if len(deleted) == 1 else "were"
        summary += f"; {plural(len(deleted), 'original')} no record needs {were} deleted"
    sys.stdout.write(summary + "\n")


# -- purge ----------------------------------------------------------------------------------------


def _purge_choice(
    args: argparse.Namespace, mdirs: list[MemoryDir]
) -> Callable[[RecordFile], bool] | None:
    """Which records ``--id`` and ``--session`` choose (``None``: any); an ID that names no
    record, or several, is a usage error before anything is listed or deleted."""
    if not (args.id or args.session):
        return None
    records = records_of(mdirs, light=True)
    ids = {(r.memory_dir, r.name) for r in resolve_ids(records, args.id or [])}
    sessions = set(args.session or ())
    for session in sorted(sessions - {r.session_id for r in records}):
        print(f"memstaged: no dead-letter record of session {session!r}", file=sys.stderr)

    def chosen(record: RecordFile) -> bool:
        return (not ids or (record.memory_dir, record.name) in ids) and (
            not sessions or record.session_id in sessions
        )

    return chosen


@guard_verdict
def run_purge(args: argparse.Namespace) -> int:
    if not (args.older_than or args.id or args.session):
        raise UsageError(
            "deadletter purge: choose what to delete with --older-than, --id or --session"
        )
    age = parse_duration(args.older_than, "--older-than") if args.older_than else None
    settings = load_settings(args)
    aliases: list[Alias] = []
    mdirs = memory_dirs(settings, writable=args.yes, aliases=aliases)
    select = _purge_choice(args, mdirs)
    clock = _common.now()
    cutoff = _common.at(clock - age) if age is not None else None
    logger = _logger(settings) if args.yes else None
    if logger is not None:
        log_same_directory(logger, aliases)
    waiter = _waiter(args)
    rows: list[dict[str, Any]] = []
    busy = False
    chosen_by = {"ids": args.id, "sessions": args.session}
    for mdir in mdirs:
        if not args.yes:
            old, originals = plan_purge(
                list_records(mdir), list_originals(mdir), cutoff=cutoff, select=select
            )
            rows.extend(_purge_rows(mdir, old, [o.name for o in originals], clock, done=False))
            continue
        done = purge(mdir, cutoff=cutoff, select=select, waiter=waiter, logger=logger)
        assert logger is not None
        logger.info(
            "deadletter_purged",
            memory_dir=mdir.path,
            older_than=args.older_than,
            **{key: value for key, value in chosen_by.items() if value},
            records=[r.name for r in done.deleted],
            originals=done.originals,
            left=done.left,
            not_tried=[r.name for r in done.not_tried],
            busy=done.busy,
            **({} if done.error is None else {"error": done.error}),
        )
        for why in (done.busy, done.error):
            if why is not None:
                print(f"memstaged: {why}", file=sys.stderr)
                busy = True
        rows.extend(_purge_rows(mdir, done.deleted, done.originals, clock, done=True))
        rows.extend(
            {
                "memory_dir": mdir.path,
                "kind": "record",
                "name": name,
                "action": "left",
                "reason": why,
            }
            for name, why in done.left.items()
        )
        rows.extend(
            {
                "memory_dir": mdir.path,
                "kind": "record",
                "name": r.name,
                "id": r.id,
                "action": "not tried",
                "reason": done.error or "the memory dir was busy: canonical-writer.lock held",
            }
            for r in done.not_tried
        )
    _show_purge(rows, args.json, args.yes, args)
    return 1 if busy or any(r["action"] in ("left", "not tried") for r in rows) else 0


def _purge_rows(
    mdir: MemoryDir, records: list[RecordFile], originals: list[str], clock: float, *, done: bool
) -> list[dict[str, Any]]:
    action = "deleted" if done else "would delete"
    rows = [
        {
            "memory_dir": mdir.path,
            "kind": "record",
            "name": r.name,
            "id": r.id,
            "session_id": r.session_id,
            "category": r.category,
            "when": iso_utc(r.when),
            "age_seconds": round(clock - r.when.timestamp(), 3),
            "action": action,
        }
        for r in records
    ]
    rows.extend(
        {"memory_dir": mdir.path, "kind": "original", "name": f"originals/{name}", "action": action}
        for name in originals
    )
    return rows


def _show_purge(
    rows: list[dict[str, Any]], as_json: bool, really: bool, args: argparse.Namespace
) -> None:
    if as_json:
        for row in rows:
            print_json(row)
        return
    table = [
        [
            r["action"],
            r["kind"],
            safe_text.name(r["name"]),
            safe_text.name(r.get("session_id") or "-"),
            human_age(r.get("age_seconds")),
            safe_text.name(r["memory_dir"]),
        ]
        for r in rows
    ]
    render_table(
        Output(args),
        "deadletter purge" + ("" if really else " (listing only: --yes deletes)"),
        ["action", "kind", "name", "session", "age", "memory dir"],
        table,
    )
    records = sum(
        r["kind"] == "record" and r["action"].endswith("delete" + "d"[:really]) for r in rows
    )
    originals = sum(r["kind"] == "original" for r in rows)
    if really:
        summary = f"deleted {plural(records, 'record')} and {plural(originals, 'original')}"
        left = sum(r["action"] == "left" for r in rows)
        not_tried = sum(r["action"] == "not tried" for r in rows)
        if left:
            summary += f"; {plural(left, 'record')} left: they changed while this ran"
        if not_tried:
            # Never a bare "deleted 0": those records were not looked at again.
            summary += (
                f"; {plural(not_tried, 'record')} not tried: the memory dir was busy "
                "(canonical-writer.lock held; see above)"
            )
        sys.stdout.write(summary + "\n")
    else:
        sys.stdout.write(
            f"would delete {plural(records, 'record')} and {plural(originals, 'original')}; "
            "run again with --yes to delete them\n"
        )
