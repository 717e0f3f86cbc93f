"""A weight update whose announcement cannot reach Redis (unavailable past `reconnect_s`) fails that publish, after
its gathers, and drops the group, which the next publish forms anew; the learner lives on (weight_sync/publisher.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from fakes.fault_proxy import FaultProxy
from fakes.receiver import join_group
from tests.timing import scaled
from weight_sync.process_group import WeightSyncError
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

pytestmark = pytest.mark.timeout(120)

NS = "wsoutage"


def test_an_update_that_cannot_be_announced_fails_the_publish_and_drops_the_group(redis_server, redis_url):
    joined = threading.Event()
    leave = threading.Event()

    def engine() -> None:
        with Rendezvous(redis_url, NS) as rv:
            group, _ = join_group(rv, "eng0", timeout_s=scaled(30))
            joined.set()
            leave.wait(scaled(60))
            group.close()

    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        rv = Rendezvous(proxy.url(), NS, reconnect_s=0.3, socket_timeout_s=0.2)
        pub = WeightPublisher(rv, WeightSyncConfig(timeout_s=30), num_engines=1)
        thread = threading.Thread(target=engine, daemon=True)
        thread.start()
        try:
            pub.connect()
            assert joined.wait(scaled(30)) and pub.group is not None
            proxy.blackhole()
            started = time.monotonic()
            # regroup=False, wait_acks=False: as the learner publishes
            with pytest.raises(WeightSyncError, match="version 3 could not be announced"):
                pub.publish(tensors.items(), 3, torch.float32, regroup=False, wait_acks=False)
            assert time.monotonic() - started < scaled(10)  # gave up after reconnect_s, not the sync timeout
            assert pub.group is None and pub.failures == 1
            proxy.restore()
        finally:
            leave.set()
            thread.join(scaled(30))
            proxy.restore()
            pub.close()
            rv.close()
