"""`sr1 run --resume` starts its generators before its learner: the weight-sync group the dead learner left in the
run's Redis must be gone by then, or each new engine joins it and waits `weight_sync.timeout_s` for a learner that
will never come."""

from __future__ import annotations


def test_the_run_withdraws_the_dead_learners_weight_sync_group(redis_url):
    from buffer.redis_buffer import ReplayBuffer
    from sr1.launch.redis_outages import withdraw_dead_learners_group
    from weight_sync.rendezvous import Rendezvous

    with Rendezvous(redis_url, "sr1") as rendezvous:
        epoch = rendezvous.next_epoch()
        info = {"addr": "127.0.0.1", "port": 29500, "backend": "gloo", "epoch": epoch, "timeout_s": 120}
        rendezvous.publish(info)
        assert rendezvous.read()["epoch"] == epoch

        buffer = ReplayBuffer(redis_url, "sr1")
        try:
            withdraw_dead_learners_group(buffer)
        finally:
            buffer.close()

        assert rendezvous.read() is None  # a new engine waits for the new learner's group
        assert rendezvous.next_epoch() == epoch + 1  # and epoch numbers are still never handed out twice
