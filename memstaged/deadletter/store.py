"""Reading the dead-letter store (SPEC section 4): its records, its originals, their IDs.

Records are read without following links and without trusting their content: a record's
``memstaged.original`` names an original only when it is a plain name under ``originals/``, so a
hand-edited record cannot make ``show`` read, or ``purge`` delete, anything outside the store.
How an operator's change (``recover``, ``purge``) is carried out beside a running daemon is
:mod:`memstaged.deadletter.changes`'s.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import msgspec

from memstaged.core import reasons
from memstaged.core.js.ecma import Parsed, is_nonempty_string, parse_json, trim
from memstaged.core.records import ORIGINALS_DIR, stem
from memstaged.errors import ConfigError, NotJSON, UsageError
from memstaged.files import fsio, safe_open
from memstaged.files.fsio import Identity
from memstaged.files.memdir import DEADLETTER, MemoryDir

#: A record larger than this is listed as unreadable rather than read into memory.
MAX_RECORD_SIZE: Final = 64 * 1024 * 1024


class RecordFile(msgspec.Struct, frozen=True):
    """One file directly in ``deadletter/`` and what could be read of it."""

    memory_dir: str
    name: str
    mtime: float
    identity: Identity | None
    value: Any = None
    exotic: bool = False
    #: Why the record could not be read or parsed; ``None`` when ``value`` holds it.
    error: str | None = None

    @property
    def id(self) -> str:
        """The record's name without ``.json``: what ``deadletter show``/``recover --id`` take."""
        return stem(self.name)

    @property
    def doc(self) -> dict[str, Any]:
        return self.value if isinstance(self.value, dict) else {}

    @property
    def meta(self) -> dict[str, Any]:
        """memstaged's own additions (absent from records the agent's tools wrote)."""
        meta = self.doc.get("memstaged")
        return meta if isinstance(meta, dict) else {}

    @property
    def session_id(self) -> str | None:
        value = self.doc.get("session_id")
        return trim(value) if isinstance(value, str) and is_nonempty_string(value) else None

    @property
    def category(self) -> str | None:
        value = self.doc.get("category")
        return value if isinstance(value, str) else None

    @property
    def category_label(self) -> str:
        """The category as listings show it: ``file`` for a whole-file record (SPEC 4.3 records
        it as ``lessons``, though it holds no lesson), ``?`` when the record names none."""
        if self.kind == "whole-file":
            return "file"
        return self.category or "?"

    @property
    def wrapped(self) -> bool:
        """SPEC 4.2's ``{"candidate": ..., "original_staging_file": ...}`` wrapper."""
        cand = self.doc.get("candidate")
        return isinstance(cand, dict) and "candidate" in cand and "original_staging_file" in cand

    @property
    def candidate(self) -> Any:
        """The candidate itself: unwrapped, or as the record holds it."""
        cand: Any = self.doc.get("candidate")
        return cand["candidate"] if self.wrapped else cand

    @property
    def kind(self) -> str:
        """``candidate`` (SPEC 4.2), ``whole-file`` (4.3), ``bare`` (the agent's own) or
        ``unreadable``."""
        if self.error is not None or not self.doc:
            return "unreadable"
        if self.wrapped:
            return "candidate"
        return "whole-file" if self.meta else "bare"

    @property
    def text(self) -> str:
        """The candidate's summary or text, or what stands in for it."""
        cand = self.candidate
        if self.kind == "unreadable":
            return f"({self.error or 'not a JSON object'})"
        if isinstance(cand, dict):
            for key in ("summary", "text"):
                value = cand.get(key)
                if isinstance(value, str) and value.strip():
                    return value
            return "(no summary or text)"
        if isinstance(cand, str):
            return f"(not JSON) {cand}"
        return "(whole file: not UTF-8 or too large)" if cand is None else "(whole file)"

    @property
    def attempts(self) -> Any:
        return self.doc.get("attempts")

    @property
    def reason(self) -> str:
        value = self.doc.get("last_gate_reason")
        return value if isinstance(value, str) else ""

    @property
    def errors(self) -> list[str]:
        """The validation errors, those no repair fixes first (an old record's are reordered)."""
        found = self.meta.get("errors")
        if not isinstance(found, list):
            return []
        left, fixed = reasons.split([str(e) for e in found], self.meta.get("repairable"))
        return [*left, *fixed]

    @property
    def repairable(self) -> list[str]:
        """The errors a repair would have fixed: not why the candidate was dead-lettered."""
        found = self.meta.get("errors")
        if not isinstance(found, list):
            return []
        return reasons.split([str(e) for e in found], self.meta.get("repairable"))[1]

    @property
    def quarantined_for(self) -> str | None:
        """Why it was dead-lettered: its own first error that no repair fixes, or else its
        file's (a valid candidate goes with its file; the record says which error took it)."""
        found = self.meta.get("errors")
        if isinstance(found, list):
            left = reasons.split([str(e) for e in found], self.meta.get("repairable"))[0]
            if left:
                return left[0]
        value = self.meta.get("quarantined_for")
        return f"with its file: {value}" if isinstance(value, str) else None

    @property
    def source_file(self) -> str | None:
        value = self.meta.get("source_file")
        return value if isinstance(value, str) else None

    @property
    def source_path(self) -> str | None:
        value = self.meta.get("source_path")
        return value if isinstance(value, str) else None

    @property
    def original(self) -> str | None:
        """The original's file name in ``originals/``, only if the record names one safely."""
        return original_ref(self.meta.get("original"))

    @property
    def when(self) -> dt.datetime:
        """When it was dead-lettered: memstaged's ``decided_at``, else the file's mtime."""
        value = self.meta.get("decided_at")
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(value)
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is not None:
                return parsed
        return dt.datetime.fromtimestamp(self.mtime, dt.UTC)


def original_ref(value: object) -> str | None:
    """``originals/<name>`` as a bare name, or ``None`` if it is anything else."""
    prefix = f"{ORIGINALS_DIR}/"
    if not isinstance(value, str) or not value.startswith(prefix):
        return None
    name = value[len(prefix) :]
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        return None
    return name


def is_record_name(name: str) -> bool:
    """Records are the ``*.json`` files directly in ``deadletter/``; dot files are temp files."""
    return name.endswith(".json") and not name.startswith(".")


@contextmanager
def _store_fd(mdir: MemoryDir, sub: str = DEADLETTER) -> Iterator[int | None]:
    """A descriptor for ``deadletter/`` (or below), ``None`` when there is none (yet)."""

    def refuse(err: OSError, where: str) -> ConfigError:
        if err.errno == errno.ELOOP:
            return ConfigError(f"{where} is a symbolic link: not followed")
        return ConfigError(f"{where}: {err.strerror}")

    try:
        mem_fd = fsio.open_dir(mdir.path)
    except FileNotFoundError:
        mem_fd = None
    except OSError as err:
        raise refuse(err, mdir.path) from None
    fd: int | None = None
    if mem_fd is not None:
        try:
            fd = fsio.open_dir(sub, mem_fd)
        except (FileNotFoundError, NotADirectoryError):
            fd = None
        except OSError as err:
            raise refuse(err, f"{mdir.path}/{sub}") from None
        finally:
            os.close(mem_fd)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


class _Wrapper(msgspec.Struct):
    """SPEC 4.2's wrapper, for listing: the embedded original file is kept unparsed."""

    candidate: Any
    original_staging_file: msgspec.Raw


_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_wrapper = msgspec.json.Decoder(_Wrapper)
_any = msgspec.json.Decoder()


def _parse_light(data: bytes) -> Parsed:
    """A record as ``deadletter list`` needs it, without building its embedded original.

    Each record holds the whole staging file it came from, and parsing that was most of what
    listing cost (20,000 records/s). The wrapper's ``original_staging_file`` is left
    as raw bytes; anything msgspec refuses is parsed in full, as :func:`parse_json` does.
    """
    try:
        raw = _fields.decode(data)
        doc: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "candidate":
                try:
                    wrapped = _wrapper.decode(value)
                except msgspec.ValidationError:
                    doc[key] = _any.decode(value)
                else:
                    doc[key] = {
                        "candidate": wrapped.candidate,
                        "original_staging_file": wrapped.original_staging_file,
                    }
            else:
                doc[key] = _any.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return parse_json(data)
    return Parsed(doc)


def read_record(
    mdir: MemoryDir, dir_fd: int, name: str, *, light: bool = False
) -> RecordFile | None:
    # Opened without a stat first: open_regular refuses links and other non-regular files
    # (ELOOP, EINVAL, ENXIO for a socket), and only those need the lstat for their mtime.
    try:
        with safe_open.open_regular(dir_fd, name) as (fd, fst):
            data = safe_open.read_fd(fd, fst.st_size, MAX_RECORD_SIZE)
            identity = Identity.of(fst)
    except FileNotFoundError:
        return None
    except OSError as err:
        st = fsio.lstat_at(dir_fd, name)
        if st is None:
            return None
        if err.errno in (errno.ELOOP, errno.EINVAL, errno.ENXIO) and not stat.S_ISREG(st.st_mode):
            return RecordFile(mdir.path, name, st.st_mtime, None, error="not a regular file")
        return RecordFile(mdir.path, name, st.st_mtime, None, error=err.strerror or str(err))
    st = fst
    if data is None:
        return RecordFile(mdir.path, name, st.st_mtime, identity, error="record too large to read")
    try:
        parsed = _parse_light(data) if light else parse_json(data)
    except NotJSON as err:
        return RecordFile(mdir.path, name, st.st_mtime, identity, error=str(err))
    if not isinstance(parsed.value, dict):
        return RecordFile(mdir.path, name, st.st_mtime, identity, error="not a JSON object")
    return RecordFile(mdir.path, name, st.st_mtime, identity, parsed.value, parsed.exotic)


def list_records(mdir: MemoryDir, *, light: bool = False) -> list[RecordFile]:
    """Every record of the memory dir, readable or not, sorted by name.

    ``light``: for listing only; each wrapper's embedded original stays unparsed bytes.
    """
    with _store_fd(mdir) as dl_fd:
        if dl_fd is None:
            return []
        out = []
        for name in sorted(n for n in os.listdir(dl_fd) if is_record_name(n)):
            record = read_record(mdir, dl_fd, name, light=light)
            if record is not None:
                out.append(record)
        return out


class Original(msgspec.Struct, frozen=True):
    name: str
    size: int
    mtime: float
    identity: Identity | None = None


def list_originals(mdir: MemoryDir) -> list[Original]:
    """The files in ``deadletter/originals/`` (memstaged's temp files excluded)."""
    with _store_fd(mdir, f"{DEADLETTER}/{ORIGINALS_DIR}") as or_fd:
        if or_fd is None:
            return []
        out = []
        for name in sorted(os.listdir(or_fd)):
            if name.startswith("."):
                continue
            st = fsio.lstat_at(or_fd, name)
            if st is not None and stat.S_ISREG(st.st_mode):
                out.append(Original(name, st.st_size, st.st_mtime, Identity.of(st)))
        return out


def read_original(mdir: MemoryDir, name: str, limit: int) -> tuple[bytes, int] | None:
    """Up to ``limit`` bytes of an original (0: all) and its full size; ``None`` if it is gone."""
    with _store_fd(mdir, f"{DEADLETTER}/{ORIGINALS_DIR}") as or_fd:
        if or_fd is None:
            return None
        try:
            with safe_open.open_regular(or_fd, name) as (fd, st):
                want = st.st_size if limit <= 0 else min(limit, st.st_size)
                chunks, got = [], 0
                while got < want:
                    chunk = os.read(fd, min(fsio.CHUNK, want - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                return b"".join(chunks), st.st_size
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ConfigError(
                f"{mdir.path}/{DEADLETTER}/{ORIGINALS_DIR}/{name}: {err.strerror}"
            ) from None


def resolve_ids(records: Sequence[RecordFile], ids: Iterable[str]) -> list[RecordFile]:
    """The records the IDs name; each ID is a record name without ``.json``, or a unique prefix.

    An ID that matches nothing, or more than one record, is a usage error (exit 2).
    """
    chosen: dict[tuple[str, str], RecordFile] = {}
    for wanted in ids:
        exact = [r for r in records if wanted in (r.id, r.name)]
        found = exact or [r for r in records if r.id.startswith(wanted)]
        if not found:
            raise UsageError(f"no dead-letter record has the ID {wanted!r}")
        if len(found) > 1:
            shown = ", ".join(r.id for r in found[:5]) + (", ..." if len(found) > 5 else "")
            raise UsageError(f"the ID {wanted!r} matches {len(found)} records: {shown}")
        chosen[(found[0].memory_dir, found[0].name)] = found[0]
    return list(chosen.values())
