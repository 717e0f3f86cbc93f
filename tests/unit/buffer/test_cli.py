"""`sr1 buffer stats|watch` and the Prometheus endpoint against a real Redis."""

from __future__ import annotations

import json
import urllib.request

from buffer.cli import main
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt


def populate(url: str) -> ReplayBuffer:
    buf = ReplayBuffer(url, "cli")
    prompts = [make_prompt(i) for i in range(4)]
    buf.release_prompts(prompts)
    for c in buf.claim_prompts("gen-0", 3):
        buf.put_group(make_group(c.prompt, n=1, response_len=8), c.entry_id)
    buf.ack([t.entry_id for t in buf.take(1, block_ms=0)])
    buf.publish_version(1)
    buf.record_consumed([0, 0, 1])
    buf.heartbeat("gen-0", "generator", {"rollout/tokens_per_s": 3.5})
    return buf


def test_stats_json(redis_url, capsys):
    populate(redis_url)
    assert main(["stats", "--json", "--url", redis_url, "--namespace", "cli"]) == 0
    out = json.loads(capsys.readouterr().out)
    stats = out["stats"]
    assert (stats["buffer/released"], stats["buffer/produced"], stats["buffer/consumed"]) == (4, 3, 1)
    assert (stats["buffer/depth"], stats["buffer/inflight_groups"], stats["buffer/pending_prompts"]) == (
        2,
        3,
        1,
    )
    assert stats["buffer/version"] == 1 and stats["buffer/staleness_hist/0"] == 2
    # the test Redis has no maxmemory: memory is shown, nothing paused
    assert stats["buffer/redis_used_mb"] > 0 and stats["buffer/redis_maxmemory_mb"] == 0
    assert stats["buffer/memory_paused"] == 0
    assert [w["worker_id"] for w in out["workers"]] == ["gen-0"]


def test_watch_once_draws_every_part(redis_url, capsys):
    populate(redis_url)
    assert main(["watch", "--once", "--url", redis_url, "--namespace", "cli"]) == 0
    out = capsys.readouterr().out
    for text in (
        "depth",
        "in flight",
        "produced / s",
        "learner version",
        "staleness",
        "gen-0",
        "tokens_per_s",
        "redis memory (MiB)",
        "redis maxmemory (MiB)",
    ):
        assert text in out, text


def test_metrics_endpoint_serves_the_same_gauges(redis_url, free_port, capsys):
    populate(redis_url)
    assert (
        main(["watch", "--once", "--url", redis_url, "--namespace", "cli", "--metrics-port", str(free_port)])
        == 0
    )
    body = urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics", timeout=5).read().decode()
    assert "sr1_buffer_depth 2.0" in body and "sr1_buffer_version 1.0" in body
    assert 'sr1_staleness_tokens{staleness="1"} 1.0' in body
    assert 'sr1_buffer_workers{role="generator"} 1.0' in body


def test_unreachable_redis_is_a_clear_error(free_port, capsys):
    assert main(["stats", "--json", "--url", f"redis://127.0.0.1:{free_port}/0"]) == 2
    assert "cannot reach Redis" in capsys.readouterr().err


def test_metrics_endpoint_serves_the_learners_off_policy_diagnostics(redis_url, free_port, capsys):
    """The bound of new releases (Redis) and the last step's mismatch KL, ESS and bound in force (the learner's
    heartbeat, as learner/loop.py sends it) reach Prometheus."""
    from learner.coordinator import DIAGNOSTICS

    buf = populate(redis_url)
    buf.set_staleness_bound(0, 3)
    step = {
        "loss/offpolicy_kl": 0.0625,
        "loss/mismatch_kl": 0.25,
        "loss/is_ess": 0.5,
        "loss/clipped_frac": 0.125,
        "loss/masked_frac": 0.0,
        "staleness/bound": 4,
        "staleness/mean": 2.5,
        "staleness/max": 4,
    }
    assert set(step) == set(DIAGNOSTICS)
    buf.heartbeat("learner-0", "learner", {"version": 1, "status": "training", **step})
    assert (
        main(["watch", "--once", "--url", redis_url, "--namespace", "cli", "--metrics-port", str(free_port)])
        == 0
    )
    body = urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics", timeout=5).read().decode()
    assert "sr1_buffer_staleness_bound 3.0" in body
    for line in (
        'sr1_learner_offpolicy_kl{worker="learner-0"} 0.0625',
        'sr1_learner_mismatch_kl{worker="learner-0"} 0.25',
        'sr1_learner_is_ess{worker="learner-0"} 0.5',
        'sr1_learner_clipped_frac{worker="learner-0"} 0.125',
        'sr1_learner_staleness_bound{worker="learner-0"} 4.0',
    ):
        assert line in body
