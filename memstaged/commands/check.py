"""``memstaged check FILE...``: decide files without touching anything.

Exit codes (the worst over all files): 0 valid, 3 repairable, 4 would be quarantined, 5 foreign,
2 usage error or unreadable file.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Any, Final

import msgspec

from memstaged.commands._common import guard_output
from memstaged.log import dumps
from memstaged.project import normalize
from memstaged.timestamps import format_epoch_ms
from memstaged.triage import Context, Decision, decide

EXIT_CODES: Final = {
    Decision.VALID: 0,
    Decision.REPAIRED: 3,
    Decision.QUARANTINED: 4,
    Decision.FOREIGN: 5,
}


def register(sub: Any) -> None:
    parser = sub.add_parser("check", help="decide files without touching anything")
    parser.add_argument("files", nargs="+", metavar="FILE", help="staging files, or - for stdin")
    parser.add_argument(
        "--project-root",
        metavar="DIR",
        help="the project root files must name (default: the one of the file's "
        "memory dir, or the current directory for stdin)",
    )
    parser.add_argument("--diff", action="store_true", help="show a repair as a diff")
    parser.add_argument("--json", action="store_true", help="one JSON line per file")
    parser.add_argument(
        "--split-invalid-candidates",
        action="store_true",
        help="decide as with split_invalid_candidates = true (repair R4)",
    )
    parser.set_defaults(func=run)


def _root_for(path: str, explicit: str | None) -> str:
    if explicit:
        return normalize(os.path.abspath(explicit))
    if path == "-":
        return normalize(os.getcwd())
    # <project>/.pi/memory/project/staging/<file>: four levels up from the file's directory.
    staging = os.path.dirname(os.path.abspath(path))
    return normalize(os.path.join(staging, "..", "..", "..", ".."))


@guard_output
def run(args: argparse.Namespace) -> int:
    worst = 0
    for path in args.files:
        try:
            if path == "-":
                data, name = sys.stdin.buffer.read(), "stdin.json"
            else:
                with open(path, "rb") as fh:
                    data, name = fh.read(), os.path.basename(path)
        except OSError as err:
            print(f"memstaged check: {path}: {err.strerror}", file=sys.stderr)
            worst = max(worst, 2, key=_SEVERITY_KEY)
            continue
        ctx = Context(
            project_root=_root_for(path, args.project_root),
            file_name=name,
            source_path=path,
            split_invalid_candidates=args.split_invalid_candidates,
            decided_at=format_epoch_ms(0),
        )
        verdict = decide(data, ctx)
        code = EXIT_CODES.get(verdict.decision, 4)
        worst = max(worst, code, key=_SEVERITY_KEY)
        if args.json:
            line = {
                "path": path,
                "decision": verdict.decision.value,
                "session_id": verdict.session_id,
                "sha256": verdict.sha256,
                "size": verdict.size,
                "reasons": list(verdict.reasons),
                "repairs": [msgspec.to_builtins(r) for r in verdict.repairs],
            }
            print(dumps(line))  # lone surrogates (JSON.parse accepts them) stay escapes
            continue
        print(f"{path}: {verdict.decision.value}")
        for reason in verdict.reasons:
            print(f"  - {reason}")
        for repair in verdict.repairs:
            wrote = msgspec.json.encode(repair.wrote).decode()
            print(f"  repair {repair.rule} at {repair.where}: {wrote}")
        if verdict.new_bytes is not None:
            if args.diff:
                before = _lines(data)
                after = _lines(verdict.new_bytes)
                sys.stdout.writelines(
                    difflib.unified_diff(before, after, path, f"{path} (repaired)")
                )
            else:
                print("  repaired file:")
                print(verdict.new_bytes.decode("utf-8", "replace"), end="")
    return worst


def _lines(data: bytes) -> list[str]:
    """Indented lines for a readable diff: both sides formatted alike, so only the repair shows."""
    body = data.removeprefix(b"\xef\xbb\xbf")
    try:
        body = msgspec.json.format(body, indent=2)
    except msgspec.DecodeError:
        body = data  # not plain JSON (exotic values): show it as it is
    text = body.decode("utf-8", "replace")
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines()]


def _severity(code: int) -> int:
    order = {0: 0, 3: 1, 5: 2, 4: 3, 2: 4}
    return order.get(code, 4)


_SEVERITY_KEY: Final = _severity
