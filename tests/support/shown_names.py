"""A name as :func:`memstaged.safe_text.name` shows it, read back: what proves that the shown
text names the file without loss (SPEC 6, "escaped reversibly")."""

from __future__ import annotations


def unquote(shown: str) -> str:
    """The name :func:`memstaged.safe_text.name` showed, as ``os.fsdecode`` gives it: the
    proof that what is shown names the file without loss."""
    if not shown.startswith('"'):
        return shown
    body = shown[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        kind = body[i + 1]
        if kind == "x":
            code = int(body[i + 2 : i + 4], 16)
            out.append(chr(0xDC00 + code) if code >= 0x80 else chr(code))
            i += 4
            continue
        if kind in "uU":
            width = 4 if kind == "u" else 8
            out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
            i += 2 + width
            continue
        out.append({"n": "\n", "r": "\r", "t": "\t"}.get(kind, kind))
        i += 2
    return "".join(out)
