"""A decider process's receiving end: the messages :class:`multiprocessing.connection.Connection`
frames, read whole (``MSG_WAITALL``) by :mod:`memstaged.run.decider_worker`."""

from __future__ import annotations

import socket
import struct
import threading
from multiprocessing.connection import Connection

import pytest

from memstaged.run.decider_worker import _receive_message


def _pair() -> tuple[Connection, socket.socket]:
    parent, child = socket.socketpair()
    return Connection(parent.detach()), child


@pytest.mark.parametrize("size", [0, 1, 16_384, 16_385, 3 << 20])
def test_each_message_sent_by_a_connection_is_received_whole(size: int) -> None:
    """Messages of every framing ``send_bytes`` uses (header and body in one write up to 16 KiB,
    in two beyond), one larger than a socket's buffer sent by another thread while the
    receiver waits, come out as sent, one by one."""
    conn, sock = _pair()
    messages = [bytes(range(256)) * (size // 256) + b"x" * (size % 256), b"next"]

    def send() -> None:
        for message in messages:
            conn.send_bytes(message)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert _receive_message(sock) == messages[0]
        assert _receive_message(sock) == messages[1]
    finally:
        sender.join()
        conn.close()
        sock.close()


def test_the_long_header_of_a_message_over_2_gib_is_read() -> None:
    """A message over 2 GiB is framed as -1 and then its size in 8 bytes (written here by hand
    for a small body: 2 GiB is not sent in a test)."""
    parent, sock = socket.socketpair()
    try:
        parent.sendall(struct.pack("!i", -1) + struct.pack("!Q", 5) + b"hello")
        assert _receive_message(sock) == b"hello"
    finally:
        parent.close()
        sock.close()


def test_a_parent_gone_mid_message_is_an_end_of_file() -> None:
    """A parent that hangs up in the middle of a message ends the worker's receiving as at a
    message's start: no partial message is decided."""
    parent, sock = socket.socketpair()
    parent.sendall(struct.pack("!i", 100) + b"only part")
    parent.close()
    try:
        with pytest.raises(EOFError):
            _receive_message(sock)
    finally:
        sock.close()
