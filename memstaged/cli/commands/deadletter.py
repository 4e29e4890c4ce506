"""``memstaged deadletter list|show|recover|purge|ack``: the dead-letter store, for an operator.

This module is the command line (every action's options, each option written once) and ``ack``;
``list`` and ``show`` are in :mod:`memstaged.cli.commands.deadletter_read`, ``recover`` and
``purge`` in :mod:`memstaged.cli.commands.deadletter_change`.

``list`` and ``show`` only read. ``recover`` puts candidates back into ``staging/`` (see
:mod:`memstaged.deadletter.recover`); ``purge`` is the only way records are ever deleted without
being recovered, and without ``--yes`` it only lists what it would delete. Both change the store
only under ``canonical-writer.lock`` (beside a running daemon), and log what they did to the
decision log.

``ack`` marks records seen: ``status`` stops asking for attention because of
them. The mark is memstaged's own, in its state dir (:mod:`memstaged.deadletter.acks`), never in the
store.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Final

from memstaged import safe_text
from memstaged.cli.commands._common import (
    add_json_option,
    add_memory_dir_options,
    add_output_options,
    load_settings,
    memory_dirs,
)
from memstaged.cli.commands._output import plural, print_json
from memstaged.cli.commands.deadletter_change import run_purge, run_recover
from memstaged.cli.commands.deadletter_read import records_of, run_list, run_show
from memstaged.cli.option_types import count, record_id, wait_seconds
from memstaged.config import own_state_dir
from memstaged.daemon import control_socket
from memstaged.deadletter import acks
from memstaged.deadletter.changes import DEFAULT_WAIT
from memstaged.deadletter.store import resolve_ids
from memstaged.errors import ConfigError, UsageError
from memstaged.files.locks import instance_holder

SHOW_BYTES: Final = 64 * 1024


#: The shell functions that complete a record ID: each runs the hidden
#: ``memstaged deadletter ids`` (see :mod:`memstaged.cli.commands.ids`), which lists the names in
#: ``deadletter/`` of the configured memory dirs. Each shell also passes on the ``--memory-dir``
#: and ``--config`` already typed on the line (``--opt VALUE`` or ``--opt=VALUE``, a leading
#: ``~/`` expanded), so that Tab offers the IDs that command will act on, and runs the
#: memstaged being completed (the line's first word). Errors go to /dev/null: a completion that
#: fails offers nothing.
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
#: zsh: ``$words`` holds only the subcommand's words there (shtab's ``*:::``), so the line is
#: split again from ``$LBUFFER`` (``(z)``, then ``(Q)`` for the quotes), less the word being
#: completed.
_ID_ZSH: Final = r"""
# the dead-letter IDs of the memory dirs the line names (or the configured ones)
_shtab_memstaged_record_ids() {
  local -a line_words chosen ids
  local prog word value i
  line_words=(${(Q)${(z)LBUFFER}})
  [[ $LBUFFER == *[^[:space:]] ]] && shift -p line_words  # the word being completed
  prog=${line_words[1]:-memstaged}
  [[ $prog == "~/"* ]] && prog=$HOME/${prog#"~/"}
  for ((i = 2; i <= $#line_words; i++)); do
    word=${line_words[i]}
    case $word in
      --memory-dir=*|--config=*) value=${word#*=}; word=${word%%=*} ;;
      --memory-dir|--config) value=${line_words[i + 1]-}; ((i++)) ;;
      *) continue ;;
    esac
    [[ $value == "~/"* ]] && value=$HOME/${value#"~/"}
    [[ -n $value ]] && chosen+=("$word=$value")
  done
  ids=(${(f)"$("$prog" deadletter ids "${chosen[@]}" -- "$PREFIX" 2>/dev/null)"})
  compadd -a ids
}
"""
_ID_FISH: Final = r"""
# the dead-letter IDs of the memory dirs the line names (or the configured ones)
function _shtab_memstaged_record_ids
  set -l tokens (commandline -opc)
  set -l prog $tokens[1]
  string match -q -- '~/*' $prog; and set prog $HOME/(string sub -s 3 -- $prog)
  set -l chosen
  set -l want ''
  for word in $tokens[2..-1]
    set -l value
    if test -n "$want"
      set value $word
      set word $want
      set want ''
    else if string match -qr -- '^--(memory-dir|config)=' $word
      set value (string replace -r -- '^[^=]*=' '' $word)
      set word (string replace -r -- '=.*' '' $word)
    else if contains -- $word --memory-dir --config
      set want $word
      continue
    else
      continue
    end
    string match -q -- '~/*' $value; and set value $HOME/(string sub -s 3 -- $value)
    test -n "$value"; and set -a chosen "$word=$value"
  end
  $prog deadletter ids $chosen -- (commandline -ct) 2>/dev/null
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
            type=record_id,
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
    _add_session_option(recoverer, "recover the records")
    _add_id_option(recoverer, "recover this record")
    recoverer.add_argument("--all", action="store_true", help="recover every record")
    recoverer.add_argument(
        "--dry-run",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show what would happen, change nothing",
    )
    _add_change_options(recoverer, run_recover, triage=True)

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
    _add_id_option(purger, "this record")
    _add_session_option(purger, "the records")
    purger.add_argument("--yes", action="store_true", help="really delete them")
    _add_change_options(purger, run_purge)

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
            type=record_id,
            metavar="ID",
            help="a record's ID (its file name without .json), or a unique prefix of it",
        )
    )
    acker.add_argument("--all", action="store_true", help="mark every record seen")
    add_memory_dir_options(acker)
    add_json_option(acker)
    acker.set_defaults(func=run_ack)

    # Hidden (no help): what the completion scripts call for the IDs (see commands/ids.py).
    from memstaged.cli.commands import ids

    lister_of_ids = actions.add_parser("ids", add_help=False)
    ids.add_arguments(lister_of_ids)
    lister_of_ids.set_defaults(func=ids.run)


def run_ack(args: argparse.Namespace) -> int:
    if bool(args.ids) == bool(args.all):
        raise UsageError(
            "memstaged deadletter ack: name the records (ID...) or give --all, not both"
        )
    settings = load_settings(args)
    state_dir = own_state_dir(settings)  # the marks are trusted, so kept only there
    if state_dir is None:
        raise ConfigError("no state dir: the marks have nowhere to be kept")
    mdirs = memory_dirs(settings, writable=False)
    chosen: dict[str, list[str]] = {m.path: [] for m in mdirs}
    if not args.all:
        for record in resolve_ids(records_of(mdirs, light=True), args.ids):
            chosen[record.memory_dir].append(record.name)
    for mdir in mdirs:
        done = acks.mark(state_dir, mdir, None if args.all else chosen[mdir.path])
        if done.changed:
            holder = instance_holder(state_dir, mdir)
            if holder is not None and holder.role == "daemon":
                control_socket.touch(holder.pid)  # its metrics file says the new unseen count
        if args.json:
            print_json(
                {
                    "memory_dir": mdir.path,
                    "marked": done.marked,
                    "seen": done.seen,
                    "unseen": done.unseen,
                }
            )
        else:
            print(
                f"{safe_text.name(mdir.path)}: {plural(done.marked, 'record')} marked seen, "
                f"{done.unseen} not yet seen"
            )
    return 0


def _add_id_option(parser: argparse.ArgumentParser, subject: str) -> None:
    """``--id``, repeatable, Tab-completed with the record IDs (recover, purge)."""
    _ids_completed(
        parser.add_argument(
            "--id",
            action="append",
            type=record_id,
            metavar="ID",
            help=f"{subject} (repeatable; a unique prefix will do)",
        )
    )


def _add_session_option(parser: argparse.ArgumentParser, subject: str) -> None:
    """``--session``, repeatable (recover, purge; ``list`` takes one glob)."""
    parser.add_argument(
        "--session",
        action="append",
        metavar="SESSION",
        help=f"{subject} of this session_id (repeatable)",
    )


def _add_change_options(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    *,
    triage: bool = False,
) -> None:
    """What recover and purge, the two actions that change the store, share after their choice
    of records: ``--wait``, the memory dirs, ``--json``, the output options; and what runs."""
    _add_wait_option(parser)
    add_memory_dir_options(parser, triage=triage)
    add_json_option(parser)
    add_output_options(parser)
    parser.set_defaults(func=run)


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
