"""`buffer.connection.answers_ping`: whether a Redis answers at a URL, asked by the launchers that wait for one
(they name Redis through the buffer, never through its client library)."""

from __future__ import annotations

import socket

from buffer.connection import answers_ping


def test_a_live_redis_answers_and_a_closed_port_does_not(redis_url):
    assert answers_ping(redis_url)
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not answers_ping(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)
