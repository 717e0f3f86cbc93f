"""Hypothesis: under any finish order of the generators, the assembler's batches keep max_staleness, hold exactly
groups_per_step groups (the quotas never ask for more), and consume every released group exactly once.

Sequential and adversarial (hypothesis picks which leased prompt finishes next); the concurrent version with real
threads, dead generators and learner restarts is tests/integration/test_buffer_staleness.py.
"""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer.admission import BatchAssembler, PromptFeeder, admission_limit
from buffer.redis_buffer import ReplayBuffer
from tests.fakes.groups import make_group, make_prompt


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_staleness=st.integers(0, 3),
    groups_per_step=st.integers(1, 3),
    steps=st.integers(2, 6),
    choices=st.lists(st.integers(0, 1_000), min_size=60, max_size=60),
)
def test_any_finish_order_keeps_the_bound_and_full_batches(
    redis_url, max_staleness, groups_per_step, steps, choices
):
    s, g = max_staleness, groups_per_step
    buf = ReplayBuffer(redis_url, f"hyp-{uuid.uuid4().hex[:8]}")
    dataset = [make_prompt(i) for i in range(steps * g)]
    feeder = PromptFeeder(buf, iter(dataset), groups_per_step=g, max_staleness=s)
    assembler = BatchAssembler(buf, groups_per_step=g, max_staleness=s)
    leased = []
    picks = iter(choices * 10)
    consumed: Counter[str] = Counter()
    for u in range(steps):
        feeder.pump()
        assert buf.released_count() <= admission_limit(u, groups_per_step=g, max_staleness=s)
        leased += buf.claim_prompts("gen", 100)
        while not (batch := assembler.next_batch(u, timeout_s=0)):
            assert leased, f"step {u} waits for a group no generator holds"
            claim = leased.pop(next(picks) % len(leased))  # the adversary picks who finishes next
            group = make_group(claim.prompt, n=1, prompt_len=2, response_len=3, version=buf.version())
            assert buf.put_group(group, claim.entry_id)
        assert len(batch) == g
        for t in batch:
            assert u - t.group.release_version <= s
            assert u - t.group.min_version() <= s
        consumed.update(t.group.group_id for t in batch)
        buf.ack([t.entry_id for t in batch])
        buf.publish_version(u + 1)
    assert consumed == Counter(p.group_id for p in dataset)  # each exactly once, none left behind
    buf.close()
