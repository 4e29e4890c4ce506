"""``memstaged deadletter list|show``: reading the dead-letter store (SPEC 4), for an operator.

Only reads: a record's line (its full ID first, what ``show``, ``recover --id`` and ``purge
--id`` take), its JSON, and ``show``'s whole story of one record (its errors, what a recovery
would do now, its original's bytes). The store itself is read by :mod:`memstaged.deadletter.store`.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import sys
from typing import Any, Final

import msgspec

from memstaged import safe_text
from memstaged.cli.commands import _common
from memstaged.cli.commands._common import (
    ProjectLabels,
    iso_utc,
    load_settings,
    local_time,
    memory_dirs,
    parse_when,
)
from memstaged.cli.commands._output import (
    Output,
    guard_output,
    one_line,
    print_json,
)
from memstaged.core.js.ecma import encode_json, pretty
from memstaged.deadletter.recover import RecordOutcome, RecoverAction, preview
from memstaged.deadletter.store import RecordFile, list_records, read_original, resolve_ids
from memstaged.errors import ConfigError
from memstaged.files.memdir import MemoryDir


def records_of(mdirs: list[MemoryDir], *, light: bool = False) -> list[RecordFile]:
    """Every record of ``mdirs`` (``light``: without the staging file a record embeds)."""
    out: list[RecordFile] = []
    for mdir in mdirs:
        out.extend(list_records(mdir, light=light))
    return out


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
    settings = load_settings(args, lenient=True)
    since = parse_when(args.since, "--since") if args.since else None
    mdirs = memory_dirs(settings, writable=False)
    records = records_of(mdirs, light=True)
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
    Then when, and the project (only ``--json`` named the memory dir)."""
    why = record.quarantined_for
    reason = record.reason + (f": {why}" if why else "")
    ident = safe_text.name(record.id)
    if out is not None:
        ident = out.paint(ident, "bold")
    project = (labels or ProjectLabels())(record.memory_dir)
    return (
        f"{ident}  {local_time(record.when)}  {safe_text.name(project)}  {record.category_label}"
        f"  session={safe_text.name(record.session_id or '-')}"
        f"  from={safe_text.name(record.source_file or '-')}"
        f"  {summary(record, mdir, 60)}  [{one_line(reason)}]"
        + (f"  attempts={record.attempts}" if record.attempts else "")
        + "\n"
    )


#: How many bytes of a whole-file record's original its summary shows.
_PREVIEW_BYTES: Final = 256


def summary(record: RecordFile, mdir: MemoryDir | None, limit: int | None = None) -> str:
    """The record's summary or text on one line, escaped; a whole-file record's is marked as
    such and shows its original's first bytes escaped (a file that is not
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
        shown = "\\ufffd" if char == "\ufffd" else safe_text.text(char)
        if limit is not None and size + len(shown) > limit - 1:
            parts.append("…")
            break
        parts.append(shown)
        size += len(shown)
    return "".join(parts)


# -- show -----------------------------------------------------------------------------------------


@guard_output
def run_show(args: argparse.Namespace) -> int:
    settings = load_settings(args, lenient=True)
    mdirs = memory_dirs(settings, writable=False)
    [record] = resolve_ids(records_of(mdirs), [args.id])
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
    record: RecordFile, outcome: RecordOutcome | None, original: tuple[bytes, int] | None
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
    ``show`` printed the whole original twice, in the record and then as text. Only the embedded
    whole file goes; a bounded record's reference to it stays."""
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


def _recovery_line(outcome: RecordOutcome | None) -> str:
    if outcome is None:
        return "-"
    if outcome.action == RecoverAction.RECOVERED:
        return f"would be recovered into staging/{outcome.staging_file}"
    if outcome.action == RecoverAction.DUPLICATE:
        return f"already there: {outcome.reason}; recover would just delete the record"
    return f"would stay: {outcome.reason}"


def _show_text(
    record: RecordFile,
    outcome: RecordOutcome | None,
    original: tuple[bytes, int] | None,
    out: Output,
    mdir: MemoryDir,
) -> None:
    lines = [
        f"record {safe_text.name(record.id)}  "
        f"({safe_text.name(record.memory_dir + '/deadletter/' + record.name)})",
        f"category: {safe_text.text(record.category_label)}   session: "
        f"{safe_text.name(record.session_id or '-')}   attempts: {record.attempts}   when: "
        f"{local_time(record.when)}   kind: {record.kind}",
        f"reason: {safe_text.text(record.reason or '-')}",
        f"summary: {summary(record, mdir, 200)}",
        f"source: {safe_text.name(record.source_path or record.source_file or '-')}",
        f"recovery now: {safe_text.text(_recovery_line(outcome))}",
    ]
    if record.quarantined_for:
        lines.insert(3, f"quarantined for: {safe_text.text(record.quarantined_for)}")
    if record.errors:
        fixed = set(record.repairable)
        lines.append("validation errors when it was dead-lettered:")
        lines.extend(
            f"  - {safe_text.text(e)}" + ("  (a repair would fix this one)" if e in fixed else "")
            for e in record.errors
        )
    info = _original_info(record, original)
    shown_below = info is not None and not info.get("missing")
    if record.error is None:
        value = _without_original(record) if shown_below else record.value
        lines.append("record:")
        lines.extend(safe_text.text(line) for line in _pretty(record, value).splitlines())
    else:
        lines.append(f"record: unreadable: {safe_text.text(record.error)}")
    if info is None:
        lines.append("original: none recorded")
    elif info.get("missing"):
        lines.append(f"original: originals/{safe_text.name(info['name'])} is missing")
    else:
        cut = f", first {info['shown']} shown" if info["truncated"] else ""
        form = "text" if "text" in info else "hex dump"
        lines.append(
            f"original: originals/{safe_text.name(info['name'])} ({info['size']} bytes{cut}), "
            f"as {form}:"
        )
        assert original is not None
        body = info["text"] if "text" in info else hexdump(original[0])
        lines.extend(safe_text.text(line) for line in body.splitlines())
    out.write("\n".join(lines) + "\n")


def text_or_none(data: bytes) -> str | None:
    """The bytes as text when they are UTF-8 without control characters other than whitespace."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any((ord(c) < 32 and c not in "\t\n\r\f") or c == "\x7f" for c in text):
        return None
    return text


def hexdump(data: bytes, width: int = 16) -> str:
    """``hexdump -C`` style: offset, bytes in hex, printable ASCII."""
    lines = []
    for offset in range(0, len(data), width):
        chunk = data[offset : offset + width]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        half = width // 2 * 3
        hexes = hexes[:half] + " " + hexes[half:] if len(chunk) > width // 2 else hexes
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<{width * 3}}  |{ascii_}|")
    return "\n".join(lines)
