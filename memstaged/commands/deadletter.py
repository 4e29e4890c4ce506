"""``memstaged deadletter list|show|recover|purge|ack``: the dead-letter store, for an operator.

``list`` and ``show`` only read. ``recover`` puts candidates back into ``staging/`` (see
:mod:`memstaged.recover`); ``purge`` is the only way records are ever deleted without being
recovered, and without ``--yes`` it only lists what it would delete. Both change the store only
under ``canonical-writer.lock`` (beside a running daemon), and log what they did to the decision
log.

``ack`` marks records seen (issue 21 item 6): ``status`` stops asking for attention because of
them. The mark is memstaged's own, in its state dir (:mod:`memstaged.acks`), never in the store.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import sys
from collections.abc import Callable
from typing import Any, Final

import msgspec

from memstaged import acks, control, display
from memstaged.argtypes import count, wait_seconds
from memstaged.commands import _common
from memstaged.commands._common import (
    Output,
    ProjectLabels,
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    guard_output,
    guard_verdict,
    human_age,
    iso_utc,
    load_settings,
    local_time,
    log_same_directory,
    memory_dirs,
    one_line,
    parse_duration,
    parse_when,
    print_json,
    render_table,
)
from memstaged.config import Alias, Settings
from memstaged.deadletter import (
    DEFAULT_WAIT,
    RecordFile,
    Waiter,
    hexdump,
    list_originals,
    list_records,
    read_original,
    resolve_ids,
    text_or_none,
)
from memstaged.ecma import encode_json, pretty
from memstaged.errors import ConfigError, UsageError
from memstaged.locks import instance_holder
from memstaged.memdir import MemoryDir
from memstaged.purge import plan_purge, purge
from memstaged.recover import Action, Outcome, Report, preview, recover

SHOW_BYTES: Final = 64 * 1024
_ACTION_STYLES: Final = {"recovered": "green", "duplicate": "cyan", "left": "yellow"}


#: The shell functions that complete a record ID (issue 22 item 7): each runs the hidden
#: ``memstaged deadletter ids`` (see :mod:`memstaged.commands.ids`), which lists the names in
#: ``deadletter/`` of the configured memory dirs. bash also passes on the ``--memory-dir`` and
#: ``--config`` already typed, and runs the memstaged being completed (``COMP_WORDS[0]``, its
#: ``~`` expanded). Errors go to /dev/null: a completion that fails offers nothing.
_ID_BASH: Final = r"""
# $1=the word being completed; prints the dead-letter IDs that start with it, one a line
_shtab_memstaged_record_ids() {
  local prog=${COMP_WORDS[0]} i word value
  [[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}
  local -a chosen=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${COMP_WORDS[i]}
    [[ $word == --memory-dir || $word == --config ]] || continue
    value=${COMP_WORDS[i + 1]-}
    [[ $value == = ]] && value=${COMP_WORDS[i + 2]-}  # --config=FILE: "=" is a word of its own
    [[ $value == "~/"* ]] && value=$HOME/${value#"~/"}
    [[ -n $value ]] && chosen+=("$word=$value")
  done
  "$prog" deadletter ids "${chosen[@]}" -- "$1" 2>/dev/null
}
"""
_ID_ZSH: Final = r"""
# the dead-letter IDs of the configured memory dirs
_shtab_memstaged_record_ids() {
  local -a ids
  ids=(${(f)"$(memstaged deadletter ids 2>/dev/null)"})
  compadd -a ids
}
"""
_ID_FISH: Final = r"""
# the dead-letter IDs of the configured memory dirs
function _shtab_memstaged_record_ids
  memstaged deadletter ids -- (commandline -ct) 2>/dev/null
end
"""
RECORD_IDS: Final = {
    "bash": "_shtab_memstaged_record_ids",
    "zsh": "_shtab_memstaged_record_ids",
    "fish": "(_shtab_memstaged_record_ids)",
    "preamble": {"bash": _ID_BASH, "zsh": _ID_ZSH, "fish": _ID_FISH},
}


def _ids_completed(action: argparse.Action) -> None:
    """Tab offers the record IDs there (shtab's custom completer: ``action.complete``)."""
    action.complete = RECORD_IDS  # type: ignore[attr-defined]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "deadletter",
        help="list, show, recover or purge dead-lettered candidates",
        description="The dead-letter store: <memory dir>/deadletter/.",
    )
    add_memory_dir_options(parser, triage=True)  # also accepted before the action
    actions = parser.add_subparsers(dest="deadletter_action", metavar="ACTION", required=True)

    lister = actions.add_parser(
        "list",
        help="the records, one line each, oldest first",
        description="One line per record, oldest first (as log): its full ID (what show, "
        "recover and purge take), when it was dead-lettered, its project, category, session, "
        "source file, summary and reason. Through a pager on a terminal.",
    )
    add_memory_dir_options(lister)
    lister.add_argument("--session", metavar="GLOB", help="only records of this session_id")
    lister.add_argument(
        "-S",
        "--since",
        metavar="WHEN",
        help="only records dead-lettered from this time on: today, yesterday, 10m, 2h, 3d or "
        "an ISO time (local unless it has an offset)",
    )
    add_json_option(lister)
    add_output_options(lister, pager=True)
    lister.set_defaults(func=run_list)

    shower = actions.add_parser("show", help="one record, its errors and its original's bytes")
    _ids_completed(
        shower.add_argument(
            "id",
            metavar="ID",
            help="the record's file name without .json, or a unique prefix of it",
        )
    )
    add_memory_dir_options(shower, triage=True)
    shower.add_argument(
        "--max-bytes",
        type=count,
        default=SHOW_BYTES,
        metavar="N",
        help=f"show at most N bytes of the original (default {SHOW_BYTES}; 0: all)",
    )
    add_json_option(shower)
    add_output_options(shower, pager=True)
    shower.set_defaults(func=run_show)

    recoverer = actions.add_parser(
        "recover",
        help="put dead-lettered candidates back into staging/",
        description="Put the chosen records' candidates back into staging/ as new files "
        "<session>.recovered-<n>.json, keeping only candidates that are now valid (after "
        "repairs) and not already in staging/. Records are deleted only once the staging file "
        "holding their candidate is durably written. Works while the daemon runs: changes are "
        "made in short transactions under canonical-writer.lock, which the daemon obeys.",
    )
    recoverer.add_argument(
        "--session",
        action="append",
        metavar="SESSION",
        help="recover the records of this session_id (repeatable)",
    )
    _ids_completed(
        recoverer.add_argument(
            "--id",
            action="append",
            metavar="ID",
            help="recover this record (repeatable; a unique prefix will do)",
        )
    )
    recoverer.add_argument("--all", action="store_true", help="recover every record")
    recoverer.add_argument(
        "--dry-run",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show what would happen, change nothing",
    )
    _add_wait_option(recoverer)
    add_memory_dir_options(recoverer, triage=True)
    add_json_option(recoverer)
    add_output_options(recoverer)
    recoverer.set_defaults(func=run_recover)

    purger = actions.add_parser(
        "purge",
        help="delete records by age, ID or session (lists them without --yes)",
        description="The only way records are deleted without being recovered. Choose them "
        "with --older-than, --id or --session (given together, a record must match each). "
        "Works while the daemon runs, in short transactions under canonical-writer.lock.",
    )
    purger.add_argument(
        "--older-than",
        metavar="DURATION",
        help="records dead-lettered longer ago than this, e.g. 30d",
    )
    _ids_completed(
        purger.add_argument(
            "--id",
            action="append",
            metavar="ID",
            help="this record (repeatable; a unique prefix will do)",
        )
    )
    purger.add_argument(
        "--session",
        action="append",
        metavar="SESSION",
        help="the records of this session_id (repeatable)",
    )
    purger.add_argument("--yes", action="store_true", help="really delete them")
    _add_wait_option(purger)
    add_memory_dir_options(purger)
    add_json_option(purger)
    add_output_options(purger)
    purger.set_defaults(func=run_purge)

    acker = actions.add_parser(
        "ack",
        help="mark records seen: status and status --check stop flagging them",
        description="Mark dead-letter records seen, so that memstaged status (and status "
        "--check) no longer asks for attention because of them. The records stay where they "
        "are, for recover; the mark is kept in memstaged's state dir "
        "($XDG_STATE_HOME/memstaged/acked/), never in the memory dir. Records dead-lettered "
        "later are unseen again.",
    )
    _ids_completed(
        acker.add_argument(
            "ids",
            nargs="*",
            metavar="ID",
            help="a record's ID (its file name without .json), or a unique prefix of it",
        )
    )
    acker.add_argument("--all", action="store_true", help="mark every record seen")
    add_memory_dir_options(acker)
    add_json_option(acker)
    acker.set_defaults(func=run_ack)

    # Hidden (no help): what the completion scripts call for the IDs (see commands/ids.py).
    from memstaged.commands import ids

    lister_of_ids = actions.add_parser("ids", add_help=False)
    ids.add_arguments(lister_of_ids)
    lister_of_ids.set_defaults(func=ids.run)


def run_ack(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        raise UsageError(
            "memstaged deadletter ack: name the records (ID...) or give --all, not both"
        )
    settings = load_settings(args)
    state_dir = settings.state_dir
    if state_dir is None:
        raise ConfigError("no state dir: the marks have nowhere to be kept")
    mdirs = memory_dirs(settings, writable=False)
    names: dict[str, list[str]] = {m.path: [] for m in mdirs}
    for mdir in mdirs:
        try:
            names[mdir.path] = acks.record_names(mdir)
        except OSError as err:
            raise ConfigError(f"{mdir.path}/deadletter: {err.strerror}") from None
    if args.all:
        chosen = names
    else:
        chosen = {m.path: [] for m in mdirs}
        for record in resolve_ids(_records(mdirs, light=True), args.ids):
            chosen[record.memory_dir].append(record.name)
    for mdir in mdirs:
        present = set(names[mdir.path])
        stored = acks.load(state_dir, mdir.path)
        seen = stored & present  # marks of records gone (recovered, purged) are dropped
        new = [n for n in chosen[mdir.path] if n not in seen]
        if new or seen != stored:
            try:
                acks.save(state_dir, mdir.path, seen | set(new))
            except OSError as err:
                raise ConfigError(f"cannot keep the marks in {state_dir}: {err.strerror}") from None
            pid = instance_holder(mdir.path)
            if pid is not None:
                control.touch(pid)  # its metrics file says the new unseen count
        unseen = len(present - seen - set(new))
        if args.json:
            print_json(
                {
                    "memory_dir": mdir.path,
                    "marked": len(new),
                    "seen": len(seen) + len(new),
                    "unseen": unseen,
                }
            )
        else:
            print(
                f"{display.name(mdir.path)}: {len(new)} record(s) marked seen, "
                f"{unseen} not yet seen"
            )
    return 0


def _records(mdirs: list[MemoryDir], *, light: bool = False) -> list[RecordFile]:
    out: list[RecordFile] = []
    for mdir in mdirs:
        out.extend(list_records(mdir, light=light))
    return out


def _logger(settings: Settings) -> Any:
    """The decision log, for recover and purge: what an operator changed is on record too."""
    from memstaged.log import configure, get_logger, open_error

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


def record_summary(record: RecordFile) -> dict[str, Any]:
    """A record as ``list --json`` prints it."""
    return {
        "id": record.id,
        "memory_dir": record.memory_dir,
        "file": record.name,
        "kind": record.kind,
        "category": record.category,
        "text": record.text,
        "attempts": record.attempts,
        "reason": record.reason,
        "errors": record.errors,
        "repairable": record.repairable,
        "quarantined_for": record.quarantined_for,
        "session_id": record.session_id,
        "source_file": record.source_file,
        "source_path": record.source_path,
        "when": iso_utc(record.when),
        "original": record.original,
    }


# -- list -----------------------------------------------------------------------------------------


@guard_output
def run_list(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    since = parse_when(args.since, "--since") if args.since else None
    mdirs = memory_dirs(settings, writable=False)
    records = _records(mdirs, light=True)
    if args.session:
        records = [r for r in records if fnmatch.fnmatchcase(r.session_id or "", args.session)]
    if since is not None:
        records = [r for r in records if r.when >= since]
    records.sort(key=lambda r: (r.when, r.memory_dir, r.name))  # newest last, as log
    by_path = {m.path: m for m in mdirs}
    labels = ProjectLabels(by_path)
    with Output(args, paged=True) as out:
        if args.json:
            for record in records:
                print_json(record_summary(record), out.stream)
        else:
            write = out.write
            for record in records:
                write(record_line(record, out, labels, by_path.get(record.memory_dir)))
    if not records:
        print("no dead-letter records", file=sys.stderr)
    return 0


def record_line(
    record: RecordFile,
    out: Output | None = None,
    labels: ProjectLabels | None = None,
    mdir: MemoryDir | None = None,
) -> str:
    """One record on one line, ID first and in full (postqueue's and git's shape): the ID is
    what ``show``, ``recover --id`` and ``purge --id`` take, so it must be copyable as it is.
    Then when, and the project (issue 22 item 2: only ``--json`` named the memory dir)."""
    why = record.quarantined_for
    reason = record.reason + (f": {why}" if why else "")
    ident = display.name(record.id)
    if out is not None:
        ident = out.paint(ident, "bold")
    project = (labels or ProjectLabels())(record.memory_dir)
    return (
        f"{ident}  {local_time(record.when)}  {display.name(project)}  {record.category or '?'}"
        f"  session={display.name(record.session_id or '-')}"
        f"  from={display.name(record.source_file or '-')}"
        f"  {summary(record, mdir, 60)}  [{one_line(reason)}]"
        + (f"  attempts={record.attempts}" if record.attempts else "")
        + "\n"
    )


#: How many bytes of a whole-file record's original its summary shows.
_PREVIEW_BYTES: Final = 256


def summary(record: RecordFile, mdir: MemoryDir | None, limit: int | None = None) -> str:
    """The record's summary or text on one line, escaped; a whole-file record's is marked as
    such and shows its original's first bytes escaped (issue 22 item 3: a file that is not
    UTF-8 showed its raw undecodable bytes, as U+FFFD replacement marks)."""
    if record.kind != "whole-file":
        return one_line(record.text, limit)
    data = None
    if record.original is not None and mdir is not None:
        try:
            got = read_original(mdir, record.original, _PREVIEW_BYTES)
        except ConfigError:
            got = None
        data = got[0] if got is not None else None
    if data is not None:
        raw = data.decode("utf-8", "surrogateescape")  # shown as \xNN, byte for byte
    else:  # no original to read: the record's text, where bad bytes are U+FFFD, said so
        cand = record.candidate
        raw = cand if isinstance(cand, str) else record.text
    return _escaped_prefix("(whole file) ", raw, limit)


def _escaped_prefix(head: str, raw: str, limit: int | None) -> str:
    """``head`` and ``raw`` escaped, cut at ``limit`` between two escapes, never inside one."""
    parts, size = [head], len(head)
    for char in raw:
        shown = "\\ufffd" if char == "\ufffd" else display.text(char)
        if limit is not None and size + len(shown) > limit - 1:
            parts.append("…")
            break
        parts.append(shown)
        size += len(shown)
    return "".join(parts)


# -- show -----------------------------------------------------------------------------------------


@guard_output
def run_show(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    mdirs = memory_dirs(settings, writable=False)
    [record] = resolve_ids(_records(mdirs), [args.id])
    mdir = next(m for m in mdirs if m.path == record.memory_dir)
    outcome = next(
        iter(preview(mdir, {record.name}, settings.options, _common.now()).outcomes), None
    )
    original = None
    if record.original is not None:
        original = read_original(mdir, record.original, max(args.max_bytes, 0))
    if args.json:
        print_json(_show_json(record, outcome, original))
        return 0
    with Output(args, paged=True) as out:
        _show_text(record, outcome, original, out, mdir)
    return 0


def _original_info(record: RecordFile, original: tuple[bytes, int] | None) -> dict[str, Any] | None:
    if record.original is None:
        return None
    if original is None:
        return {"name": record.original, "missing": True}
    data, size = original
    info: dict[str, Any] = {
        "name": record.original,
        "size": size,
        "shown": len(data),
        "truncated": len(data) < size,
    }
    text = text_or_none(data)
    if text is not None:
        info["text"] = text
    else:
        info["base64"] = base64.b64encode(data).decode("ascii")
    return info


def _show_json(
    record: RecordFile, outcome: Outcome | None, original: tuple[bytes, int] | None
) -> dict[str, Any]:
    out = record_summary(record)
    out["recovery"] = msgspec.to_builtins(outcome) if outcome is not None else None
    out["record"] = record.value
    out["record_error"] = record.error
    out["original"] = _original_info(record, original)
    return out


#: What stands in the record's JSON for the original file shown below it.
_SHOWN_BELOW: Final = "(the original file: shown below)"


def _without_original(record: RecordFile) -> Any:
    """The record's value with the staging file it embeds replaced by :data:`_SHOWN_BELOW`:
    ``show`` printed the whole original twice, in the record and then as text (issue 22 item
    3). Only the embedded whole file goes; a bounded record's reference to it stays."""
    value = record.value
    if not isinstance(value, dict):
        return value
    if record.wrapped:
        embedded = value["candidate"]["original_staging_file"]
        if isinstance(embedded, dict) and "memstaged_original" in embedded:
            return value
        return {**value, "candidate": {**value["candidate"], "original_staging_file": _SHOWN_BELOW}}
    if record.kind == "whole-file" and value.get("candidate") is not None:
        return {**value, "candidate": _SHOWN_BELOW}
    return value


def _pretty(record: RecordFile, value: Any) -> str:
    encoded = encode_json(value, exotic=record.exotic)
    try:
        return pretty(encoded).decode("utf-8", "replace")
    except (msgspec.DecodeError, ValueError):
        return encoded.decode("utf-8", "replace")


def _recovery_line(outcome: Outcome | None) -> str:
    if outcome is None:
        return "-"
    if outcome.action == Action.RECOVERED:
        return f"would be recovered into staging/{outcome.staging_file}"
    if outcome.action == Action.DUPLICATE:
        return f"already there: {outcome.reason}; recover would just delete the record"
    return f"would stay: {outcome.reason}"


def _show_text(
    record: RecordFile,
    outcome: Outcome | None,
    original: tuple[bytes, int] | None,
    out: Output,
    mdir: MemoryDir,
) -> None:
    lines = [
        f"record {display.name(record.id)}  "
        f"({display.name(record.memory_dir + '/deadletter/' + record.name)})",
        f"category: {display.text(record.category)}   session: "
        f"{display.name(record.session_id or '-')}   attempts: {record.attempts}   when: "
        f"{local_time(record.when)}   kind: {record.kind}",
        f"reason: {display.text(record.reason or '-')}",
        f"summary: {summary(record, mdir, 200)}",
        f"source: {display.name(record.source_path or record.source_file or '-')}",
        f"recovery now: {display.text(_recovery_line(outcome))}",
    ]
    if record.quarantined_for:
        lines.insert(3, f"quarantined for: {display.text(record.quarantined_for)}")
    if record.errors:
        fixed = set(record.repairable)
        lines.append("validation errors when it was dead-lettered:")
        lines.extend(
            f"  - {display.text(e)}" + ("  (a repair would fix this one)" if e in fixed else "")
            for e in record.errors
        )
    info = _original_info(record, original)
    shown_below = info is not None and not info.get("missing")
    if record.error is None:
        value = _without_original(record) if shown_below else record.value
        lines.append("record:")
        lines.extend(display.text(line) for line in _pretty(record, value).splitlines())
    else:
        lines.append(f"record: unreadable: {display.text(record.error)}")
    if info is None:
        lines.append("original: none recorded")
    elif info.get("missing"):
        lines.append(f"original: originals/{display.name(info['name'])} is missing")
    else:
        cut = f", first {info['shown']} shown" if info["truncated"] else ""
        form = "text" if "text" in info else "hex dump"
        lines.append(
            f"original: originals/{display.name(info['name'])} ({info['size']} bytes{cut}), "
            f"as {form}:"
        )
        assert original is not None
        body = info["text"] if "text" in info else hexdump(original[0])
        lines.extend(display.text(line) for line in body.splitlines())
    out.write("\n".join(lines) + "\n")


# -- recover --------------------------------------------------------------------------------------


def _add_wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        nargs="?",
        const=DEFAULT_WAIT,
        type=wait_seconds,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"when canonical-writer.lock is held (the reconciler at work), wait up to SECONDS "
        f"(default {DEFAULT_WAIT:g}) for it instead of exiting 1",
    )


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
    stays = (Action.LEFT, Action.BUSY)
    left = any(o.action in stays for r in reports for o in r.outcomes)
    return 1 if left or any(r.busy is not None for r in reports) else 0


def _selection(args: argparse.Namespace, mdirs: list[MemoryDir]) -> dict[str, set[str]] | None:
    """memory dir -> record names chosen; ``None`` for ``--all``. Bad IDs are usage errors."""
    if args.all:
        return None
    records = _records(mdirs)
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
            display.name(o.id),
            display.name(o.session_id or "-"),
            o.category or "?",
            o.action,
            display.name(o.staging_file or "-"),
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
    counts = {a.value: sum(o.action == a.value for o in outcomes) for a in Action}
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
            f"; {counts['busy']} not tried because {len(busy)} memory dir(s) were busy "
            "(canonical-writer.lock held; see above): still in the dead-letter store"
        )
    if deleted:
        summary += f"; {len(deleted)} original(s) no record needs were deleted"
    sys.stdout.write(summary + "\n")


# -- purge ----------------------------------------------------------------------------------------


def _purge_choice(
    args: argparse.Namespace, mdirs: list[MemoryDir]
) -> Callable[[RecordFile], bool] | None:
    """Which records ``--id`` and ``--session`` choose (``None``: any); an ID that names no
    record, or several, is a usage error before anything is listed or deleted."""
    if not (args.id or args.session):
        return None
    records = _records(mdirs, light=True)
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
            display.name(r["name"]),
            display.name(r.get("session_id") or "-"),
            human_age(r.get("age_seconds")),
            display.name(r["memory_dir"]),
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
        summary = f"deleted {records} record(s) and {originals} original(s)"
        left = sum(r["action"] == "left" for r in rows)
        not_tried = sum(r["action"] == "not tried" for r in rows)
        if left:
            summary += f"; {left} record(s) left: they changed while this ran"
        if not_tried:
            # Never a bare "deleted 0": those records were not looked at again.
            summary += (
                f"; {not_tried} record(s) not tried: the memory dir was busy "
                "(canonical-writer.lock held; see above)"
            )
        sys.stdout.write(summary + "\n")
    else:
        sys.stdout.write(
            f"would delete {records} record(s) and {originals} original(s); "
            "run again with --yes to delete them\n"
        )
