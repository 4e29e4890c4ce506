"""A service manager's notification socket, for a daemon run outside systemd: the tests read
the ``READY=1``, ``STATUS=`` and ``WATCHDOG=1`` datagrams it sends, as systemd would."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading


class NotifySocket:
    """A service manager's ``NOTIFY_SOCKET``: every datagram received, in order, by a thread."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ms-notify-")  # AF_UNIX paths: 108 bytes at most
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self.closing = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.closing:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def statuses(self) -> list[str]:
        """Every ``STATUS=`` text received so far, in order."""
        return [
            line.removeprefix("STATUS=")
            for message in list(self.messages)
            for line in message.split("\n")
            if line.startswith("STATUS=")
        ]

    def close(self) -> None:
        self.closing = True
        self.thread.join(timeout=5)
        self.sock.close()
        shutil.rmtree(self.dir)
