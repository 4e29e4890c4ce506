"""stdout as every command writes it: the first error it met kept, and a reader that leaves.

:func:`memstaged.cli.main.main` puts a :class:`Stdout` in place of ``sys.stdout``. An error a
write or a flush meets (a full disk, ``/dev/full``, a stdout closed by ``>&-``) is kept
(:attr:`Stdout.lost`): it is said in one line, and the exit code is then never 0. A reader that
leaves (``| head -1``) is no such error: a command whose product is its output ends quietly
(:func:`memstaged.cli.commands._output.guard_output`); one whose exit code is a verdict or whose
work changes things goes on, its output dropped (:meth:`Stdout.dropping`). Imported by every
command, so it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import errno
import io
import sys
from collections.abc import Iterator
from typing import IO, Any

from memstaged import safe_text


def to_devnull() -> None:
    """Point stdout at /dev/null, so that no later write or final flush can fail again."""
    from memstaged.files import fsio  # only once a reader left or output was lost

    try:
        fsio.devnull_over(sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is not a real file (a test's capture): nothing will flush it


class Stdout(io.TextIOBase):
    """stdout, keeping the first error a write or flush met; a reader that left is not one."""

    def __init__(self, stream: IO[str] | None) -> None:
        super().__init__()
        #: None: stdout is closed (``>&-``); the first write is then an error, said once.
        self.stream = stream
        self.lost: OSError | None = None
        #: The reader left in a :meth:`dropping` block: what is written goes nowhere from then on.
        self.reader_left = False
        self._dropping = False

    @contextlib.contextmanager
    def dropping(self) -> Iterator[None]:
        """In the block, a reader that leaves makes the rest of the output go nowhere, silently."""
        before, self._dropping = self._dropping, True
        try:
            yield
        finally:
            self._dropping = before

    def write(self, text: str) -> int:
        if self.stream is None:
            self.lost = self.lost or OSError(errno.EBADF, "it is closed")
            raise self.lost
        if self.reader_left:
            return len(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            if not self._dropping:
                raise
            self._leave()
            return len(text)
        except OSError as err:
            self.lost = self.lost or err
            raise

    def flush(self) -> None:
        if self.stream is None or self.reader_left:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            if not self._dropping:
                raise
            self._leave()
        except OSError as err:
            self.lost = self.lost or err
            raise
        except ValueError:  # closed
            return

    def _leave(self) -> None:
        self.reader_left = True
        to_devnull()

    def isatty(self) -> bool:
        return self.stream is not None and safe_text.is_terminal(self.stream)

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation("stdout is closed")
        return self.stream.fileno()

    def reconfigure(self, **options: Any) -> None:
        reconfigure = getattr(self.stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(**options)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.stream, "errors", None)
