"""The buffer behind a fault proxy (fakes/fault_proxy.py) on a real Redis: a black hole is an error, not a
hang; a cut shorter than `reconnect_s` is ridden out; a cut past a lease hands the prompt to another generator and
the late copy is a counted duplicate; a learner cut whose read is delivered late still gets its batch; a publish
delivered late never takes the version back.

Time limits (tests/timing.py): a socket timeout that must fire DURING a cut of fixed length (0.4 s against a 1.5 s
cut) and a lease that must expire are the behaviour, and stay as written; every other limit — the clients not behind
the cut, retry budgets, joins, waits for held-back bytes to arrive — is `scaled` to the machine's speed."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from buffer.admission import BatchAssembler
from buffer.redis_buffer import ReplayBuffer
from fakes.fault_proxy import FaultProxy
from fakes.groups import make_group, make_prompt
from tests.timing import scaled

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, not a stuck CI job


@pytest.fixture
def proxy(redis_server, redis_url):
    with FaultProxy(("127.0.0.1", redis_server.port)) as p:
        yield p


CUT_SOCKET_TIMEOUT_S = 0.4  # shorter than the cuts below, so a request sent into one times out during it


def _buf(url: str, **kw) -> ReplayBuffer:
    """A client whose limits all guard against a hang (scaled), unless the test passes the one it is about."""
    kw = {"lease_s": 30, "socket_timeout_s": scaled(0.4), "reconnect_s": scaled(20)} | kw
    return ReplayBuffer(url, "net", **kw)


def _group(prompt):
    return make_group(prompt, n=2, response_len=10)


def _in_thread(call):
    """Run `call` in a thread; the returned list gets its result (or the exception it raised)."""
    out: list = []

    def run():
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_black_holed_redis_is_an_error_not_a_hang(proxy, redis_url):
    # the black hole lasts until the client gives up, so its limits race nothing: scaled, they still must end it
    buf = _buf(proxy.url(), reconnect_s=scaled(0.5))
    buf.publish_version(3)
    proxy.blackhole()
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        buf.version()  # the socket timeout turns silence into an error the retry loop handles, then gives up
    assert buf.reconnects.count >= 1 and proxy.held["client"] >= 1  # the request was held back
    proxy.restore()
    assert buf.version() == 3


@pytest.mark.parametrize("fault", ["blackhole", "drop", "delay"])
def test_a_cut_shorter_than_reconnect_s_is_ridden_out_and_puts_once(proxy, redis_url, fault):
    direct = _buf(redis_url)
    direct.release_prompts([make_prompt(0)])
    generator = _buf(proxy.url(), socket_timeout_s=CUT_SOCKET_TIMEOUT_S)  # times out during the 1.5 s cut
    (claim,) = generator.claim_prompts("gen-0", 1)
    if fault == "delay":
        proxy.delay(0.1)  # below the socket timeout: slower, never an error
    else:
        getattr(proxy, fault)()
    thread, result = _in_thread(lambda: generator.put_group(_group(claim.prompt), claim.entry_id))
    time.sleep(1.5)
    proxy.restore()
    thread.join(scaled(30))
    assert not isinstance(result[0], Exception), result
    time.sleep(scaled(0.3))  # copies the proxy held back are delivered now, after the retry
    assert [t.group.group_id for t in direct.take(5, block_ms=0)] == [claim.prompt.group_id]
    stats = direct.stats()
    assert stats["buffer/produced"] == 1 and stats["buffer/leased_prompts"] == 0
    if fault != "delay":
        assert generator.reconnects.count >= 1


def test_a_generator_cut_past_its_lease_loses_the_prompt_to_another_and_its_late_put_is_a_duplicate(
    proxy, redis_url
):
    direct = _buf(redis_url, lease_s=0.5)
    direct.release_prompts([make_prompt(0)])
    cut = _buf(proxy.url(), lease_s=0.5)
    (claim,) = cut.claim_prompts("gen-0", 1)
    proxy.blackhole()
    renewal, _ = _in_thread(
        lambda: cut.renew_leases("gen-0", [claim.entry_id])
    )  # held back, like the put below
    time.sleep(0.7)  # past the lease
    (reclaimed,) = direct.claim_prompts("gen-1", 1)
    assert reclaimed.entry_id == claim.entry_id
    assert direct.put_group(_group(reclaimed.prompt), reclaimed.entry_id)
    late, result = _in_thread(lambda: cut.put_group(_group(claim.prompt), claim.entry_id))
    time.sleep(0.5)
    proxy.restore()
    late.join(scaled(30))
    renewal.join(scaled(30))
    assert result == [False]  # a counted duplicate, never delivered
    time.sleep(scaled(0.3))
    assert [t.group.group_id for t in direct.take(5, block_ms=0)] == [claim.prompt.group_id]
    stats = direct.stats()
    assert stats["buffer/produced"] == 1 and stats["buffer/duplicates"] >= 1
    assert stats["buffer/inflight_groups"] == 1  # one group in flight, not two


def test_a_learner_cut_while_groups_arrive_still_gets_exactly_its_batch(proxy, redis_url):
    """The learner's reads are held back during the cut; on return one of them may be executed after the client
    gave up on it, delivering the new groups to the learner's consumer unseen (a lost reply): the assembler takes
    its pending entries back after a reconnect, so the batch completes either way, each group once."""
    direct = _buf(redis_url)
    direct.release_prompts([make_prompt(i) for i in range(3)])
    learner = _buf(proxy.url(), socket_timeout_s=CUT_SOCKET_TIMEOUT_S)  # times out during the 1.5 s cut
    assembler = BatchAssembler(learner, groups_per_step=3, max_staleness=0)
    proxy.blackhole()
    waiting, batch = _in_thread(lambda: assembler.next_batch(0, timeout_s=scaled(30)))
    time.sleep(0.5)
    for c in direct.claim_prompts("gen-0", 3):
        direct.put_group(_group(c.prompt), c.entry_id)
    time.sleep(1.0)
    proxy.restore()
    waiting.join(scaled(40))
    assert sorted(t.group.group_id for t in batch[0]) == sorted(make_prompt(i).group_id for i in range(3))
    assert learner.reconnects.count >= 1


def test_a_version_published_during_a_cut_and_delivered_late_does_not_take_it_back(proxy, redis_url):
    direct = _buf(
        redis_url
    )  # not behind the cut: under load its 0.4 s timeout fired (issue #50), so it is scaled
    cut = _buf(proxy.url(), reconnect_s=scaled(0.3))  # black-holed until it gives up: nothing it races
    proxy.blackhole()
    with pytest.raises((redis.TimeoutError, redis.ConnectionError)):
        cut.publish_version(5)  # sent, held back; the client gives up
    direct.publish_version(6)  # meanwhile the learner published the next version another way
    proxy.restore()
    time.sleep(scaled(0.5))  # the held-back publish of 5 reaches Redis now
    assert direct.version() == 6


def test_the_proxy_cuts_only_the_clients_it_is_told_to(redis_server, redis_url):
    who = ["learner"]  # the label of the next connection accepted
    with FaultProxy(("127.0.0.1", redis_server.port), label=lambda peer: who[0]) as proxy:
        # a drop resets the connection at once: these timeouts only guard against a hang
        learner = redis.Redis.from_url(proxy.url(), socket_timeout=scaled(0.3))
        learner.ping()
        who[0] = "generator"
        generator = redis.Redis.from_url(proxy.url(), socket_timeout=scaled(0.3))
        generator.ping()
        proxy.drop(who="generator")
        with pytest.raises(redis.ConnectionError):
            generator.ping()  # its connection is reset ...
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(
                proxy.url(), socket_timeout=scaled(0.3)
            ).ping()  # ... and so is every new one of its
        assert learner.ping() and proxy.refused >= 1
        assert proxy.dropped == {"generator": 1}
        proxy.restore(who="generator")
        assert generator.ping()


def test_a_connection_closed_during_a_black_hole_is_not_counted_as_traffic_held(redis_server):
    """`held` is the proof that a cut met live traffic: a request sent into the black hole counts, an idle pooled
    connection that its client closes meanwhile (aiohttp's keep-alive does after 15 s) does not."""
    import socket

    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        idle, busy = (socket.create_connection(("127.0.0.1", proxy.port)) for _ in range(2))
        busy.sendall(b"PING\r\n")
        assert busy.recv(64) == b"+PONG\r\n"  # both connections are up before the cut
        proxy.blackhole()
        time.sleep(scaled(0.3))  # every pump of the proxy has seen the cut (it looks every _POLL_S)
        idle.close()
        time.sleep(scaled(0.5))  # the proxy has seen the close
        assert proxy.held["client"] == 0
        busy.sendall(b"PING\r\n")
        deadline = time.monotonic() + scaled(5)
        while proxy.held["client"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.held["client"] == 1
        proxy.restore()
        busy.settimeout(scaled(5))
        assert busy.recv(64) == b"+PONG\r\n"  # what was held is delivered when the cut ends
        busy.close()
