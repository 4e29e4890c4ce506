"""One event of the decision log, in each form its sinks want (SPEC 7).

An event is a flat dict of JSON values. Here it becomes the JSON line of the decision log file
(and of a non-terminal stderr, and of ``--json`` output), the one readable line a person reads
(the journal's ``MESSAGE``, the terminal), and journald's fields (``MEMSTAGED_<KEY>``,
``PRIORITY``, a ``MESSAGE_ID`` per kind of event). Pure: no sink, no file;
:mod:`memstaged.log.writer` sends the forms made here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any, Final

import msgspec

from memstaged import safe_text

#: One MESSAGE_ID per kind of event, so ``journalctl MESSAGE_ID=...`` finds them all.
MESSAGE_IDS: Final = {
    "decision": "6f1c2a0d3b7e4f5a9c8d1e2f3a4b5c6d",
    "start": "0b9a5c3e7d2f4a1b8c6e9d0f1a2b3c4d",
    "ready": "1c2d3e4f5a6b4c7d8e9f0a1b2c3d4e5f",
    "reload": "2d3e4f5a6b7c4d8e9f0a1b2c3d4e5f6a",
    "stop": "3e4f5a6b7c8d4e9f0a1b2c3d4e5f6a7b",
    "rescan": "4f5a6b7c8d9e4f0a1b2c3d4e5f6a7b8c",
    "lock_seen": "5a6b7c8d9e0f4a1b2c3d4e5f6a7b8c9d",
    "overflow_recovered": "6b7c8d9e0f1a4b2c3d4e5f6a7b8c9d0e",
    "temp_recovered": "7c8d9e0f1a2b4c3d4e5f6a7b8c9d0e1f",
    "staging_unreadable": "d0de64b33418400bb5127d39534f108d",
    "error": "8d9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a",
    "memory_dir_added": "65074dd73b6e4cc18b67746f05643212",
    "memory_dir_removed": "e19989db96c24cb4abba9639326e11b8",
    "memory_dir_busy": "9e6e3817119a4076b6638db108148301",
    "memory_dir_error": "8b1a3b02e3754abe93bbe98158de47dc",
    "deciders_stopped": "0a3a06a642b947cfa4f3675e5c29a89c",
    "memory_dir_skipped": "3df9a49682ef4e6a892a6cd587e917da",
    "project_root_physical": "dfbf988254f048398503b20e34b87eef",
    "staging_changed": "a8e4907125ee4ee396ef6669bfe3bb82",
    "watch_failed": "cb27afd0a35d49a4a4901ed0657842aa",
    "observer_died": "845149373c7f4d0fa061fbb6413af8a4",
    "control_failed": "dfc8f1892cbe4ffd83b817134dcdef71",
    "metrics_failed": "5375906a46224e4abcd49393fe7fc4ad",
    "metrics_recovered": "714d20d2c80246c6ba5d198511111131",
    "conflict_parked": "023eb8ebcf7c4082b4de5aaa93ec199c",
    "crash": "0613292014ac4ba1b43dd000e3254af1",
    "deadletter_recovery": "f2daf41895f2415ca6db03d959d24115",
    "deadletter_recovered": "70aca388f2464c9e95e4af7a81a66fca",
    "deadletter_recover_failed": "1d0bc16b998e47e1837ff145e4d08bb8",
    "deadletter_purged": "4e1c77b319434bf89fee629cfef8f75f",
    "deadletter_recovering": "c1bc6c6e49db46839cb2e0da7baa4222",
    "deadletter_purging": "b0ed35b57edb4753811565a6d44efd25",
    "deadletter_originals_deleting": "1dea8f43504a4da6b7f4e33777d0766a",
}
_DEFAULT_MESSAGE_ID: Final = "9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a3b"
#: syslog priorities: a quarantine is a warning, errors are errors, the rest information.
_PRIORITIES: Final = {
    "quarantined": 4,
    "deferred": 6,
    "repaired": 5,
    "foreign": 6,
    "valid": 6,
    "skipped": 6,
}
_LEVEL_PRIORITIES: Final = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


#: The standard library's separators as msgspec writes them.
_COMPACT: Final = (",", ":")


def _json_default(value: object) -> object:
    return str(value)


def dumps(event: Any) -> str:
    """Serialize an event; falls back to the standard library for values msgspec refuses."""
    try:
        return msgspec.json.encode(event).decode()
    except (TypeError, UnicodeEncodeError, OverflowError):
        # Compact as msgspec writes: one command's --json lines must not change form when a
        # file name is not UTF-8 (status --json's later objects had spaces).
        return json.dumps(event, default=_json_default, separators=_COMPACT)


def message(event: MutableMapping[str, Any]) -> str:
    """The one readable line for a person (journal ``MESSAGE``, the console).

    Names and reasons come from whoever writes to ``staging/``: every control character is
    escaped (:mod:`memstaged.safe_text`), so a file name with a newline or an ESC can neither
    fake a log line nor drive the terminal. A repair says which.
    """
    kind = event.get("event", "")
    if kind == "decision":
        decision = event.get("decision")
        text = f"{decision} {safe_text.name(event.get('path'))}"
        if event.get("dry_run"):
            text = f"{decision} (dry run) {safe_text.name(event.get('path'))}"
        repairs = [r for r in event.get("repairs") or [] if isinstance(r, dict)]
        reasons = event.get("reasons") or []
        if event.get("own_rewrite"):
            text += ": memstaged's own rewrite, looked at again (not a new decision)"
        elif repairs:
            text += f": repaired by {safe_text.repairs(repairs)}"
        elif reasons:
            text += f": {safe_text.text(reasons[0])}" + (
                f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            )
        return text
    extras = ", ".join(
        f"{k}={safe_text.text(v)}"
        for k, v in event.items()
        if k not in ("event", "timestamp", "level") and v is not None  # not "abandoned=None"
    )
    return f"{kind}: {extras}" if extras else str(kind)


def priority(event: MutableMapping[str, Any]) -> int:
    if event.get("event") == "decision" and event.get("level", "info") == "info":
        return _PRIORITIES.get(str(event.get("decision")), 6)
    return _LEVEL_PRIORITIES.get(str(event.get("level", "info")), 6)


def journal_fields(event: MutableMapping[str, Any]) -> dict[str, str]:
    """Every event key as a ``MEMSTAGED_<KEY>`` field; lists and dicts as JSON text."""
    fields: dict[str, str] = {}
    for key, value in event.items():
        if value is None:
            continue  # an unknown session id has no field, rather than the text "null"
        name = "MEMSTAGED_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in key)
        fields[name.upper()[:64]] = value if isinstance(value, str) else dumps(value)
    fields["MESSAGE"] = message(event)
    fields["PRIORITY"] = str(priority(event))
    fields["MESSAGE_ID"] = MESSAGE_IDS.get(str(event.get("event")), _DEFAULT_MESSAGE_ID)
    fields["SYSLOG_IDENTIFIER"] = "memstaged"
    return fields


_ENCODER: Final = msgspec.json.Encoder()


def render(event: Mapping[str, Any]) -> bytes:
    """The event's JSON line, newline included: rendered once, for the file and a non-TTY stderr.

    The same bytes :func:`dumps` gives; a value neither encoder takes (a key that is not a string,
    a list that contains itself) is logged as text rather than losing the event.
    """
    try:
        return _ENCODER.encode(event) + b"\n"
    except (TypeError, UnicodeEncodeError, OverflowError):
        pass  # msgspec refuses it: the standard library's encoder below says it differently
    try:
        return json.dumps(event, default=_json_default, separators=_COMPACT).encode() + b"\n"
    except (TypeError, ValueError, RecursionError):
        flat = {str(key): _json_default(value) for key, value in event.items()}
        return json.dumps(flat, separators=_COMPACT).encode() + b"\n"
