"""Waiting out a Redis outage longer than `buffer.reconnect_s` (`buffer.connection.until_answered`), as the learner's
rank 0 does for the writes a step must make, its other ranks held meanwhile (learner/coordinator.py)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.connection import connect, until_answered
from buffer.redis_buffer import ReplayBuffer
from fakes.fault_proxy import FaultProxy
from tests.timing import scaled

pytestmark = pytest.mark.timeout(60)

RECONNECT_S = 0.3  # each try gives up this soon; the outages below last several times longer


@pytest.fixture
def proxy(redis_server, redis_url):
    with FaultProxy(("127.0.0.1", redis_server.port)) as p:
        yield p


def _buf(url: str) -> ReplayBuffer:
    return ReplayBuffer(url, "outage", socket_timeout_s=0.2, reconnect_s=RECONNECT_S)


def test_a_write_waits_out_an_outage_many_times_reconnect_s_and_lands_once_it_ends(proxy, redis_url):
    buf = _buf(proxy.url())
    buf.publish_version(2)
    proxy.blackhole()
    result: list = []

    def write() -> None:
        try:
            result.append(
                until_answered(lambda: buf.publish_version(3), "publish", lambda: False, pause_s=0.05)
            )
        except Exception as exc:  # noqa: BLE001 - handed to the test
            result.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(5 * RECONNECT_S)
    assert thread.is_alive() and not result  # still waiting, past several tries
    failures_during = buf.reconnects.count
    proxy.restore()
    thread.join(scaled(20))
    assert result == [None]
    assert failures_during >= 2  # it gave up and tried again more than once
    assert _buf(redis_url).version() == 3


def test_asked_to_give_up_it_raises_the_outage_error(proxy, redis_url):
    buf = _buf(proxy.url())
    proxy.blackhole()
    tries = []

    def give_up() -> bool:
        tries.append(time.monotonic())
        return len(tries) >= 2

    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        until_answered(lambda: buf.publish_version(1), "publish", give_up, pause_s=0.05)
    assert len(tries) == 2
    proxy.restore()
    assert _buf(redis_url).version() in (0, 1)  # a write in flight when the outage began may have landed


def test_a_refused_command_is_not_waited_out(redis_url):
    client, _ = connect(redis_url, reconnect_s=RECONNECT_S)
    calls = []

    def refused() -> None:
        calls.append(1)
        client.execute_command("NO-SUCH-COMMAND")

    with pytest.raises(redis.ResponseError):
        until_answered(refused, "a bad command", lambda: False)
    assert calls == [1]  # an error Redis answered with is the caller's, at once
