"""Hypothesis: under any finish order of the generators, the assembler's batches keep max_staleness, hold exactly
groups_per_step groups (the quotas never ask for more), and consume every released group exactly once; with DAPO's
dynamic sampling, also under any choice of which groups are dropped and replaced.

Sequential and adversarial (hypothesis picks which leased prompt finishes next); the concurrent version with real
threads, dead generators and learner restarts is tests/integration/test_buffer_staleness.py.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buffer.admission import BatchAssembler, PromptFeeder
from buffer.redis_buffer import ReplayBuffer
from buffer.staleness import admission_limit
from fakes.groups import make_group, make_prompt


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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_staleness=st.integers(0, 3),
    groups_per_step=st.integers(1, 3),
    steps=st.integers(2, 6),
    choices=st.lists(st.integers(0, 1_000), min_size=60, max_size=60),
    drops=st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_dynamic_sampling_drops_and_replaces_within_the_bound(
    redis_url, max_staleness, groups_per_step, steps, choices, drops
):
    """DAPO's dynamic sampling: the adversary also picks which finished groups are uninformative (equal rewards).
    Those are dropped and replaced by new releases; every batch still holds groups_per_step groups, all
    informative, within max_staleness, and every released group is trained once, dropped, or still in flight."""
    from learner.algorithms.shaping import informative

    s, g = max_staleness, groups_per_step
    buf = ReplayBuffer(redis_url, f"hyp-ds-{uuid.uuid4().hex[:8]}")
    dataset = [make_prompt(i) for i in range(2_000)]
    feeder = PromptFeeder(buf, iter(dataset), groups_per_step=g, max_staleness=s)
    assembler = BatchAssembler(
        buf, groups_per_step=g, max_staleness=s, keep_group=informative, replenish=feeder.pump
    )
    uninformative = itertools.cycle([*drops, False])  # at least one informative group in every cycle
    leased = []
    picks = iter(choices * 10)
    consumed: Counter[str] = Counter()
    put_uninformative: set[str] = set()
    for u in range(steps):
        feeder.pump()
        assert (
            buf.released_count()
            <= admission_limit(u, groups_per_step=g, max_staleness=s) + buf.replaced_count()
        )
        while not (batch := assembler.next_batch(u, timeout_s=0)):
            leased += buf.claim_prompts("gen", 100)  # including the replacements of dropped groups
            assert leased, f"step {u} waits for a group no generator holds"
            claim = leased.pop(next(picks) % len(leased))
            group = make_group(claim.prompt, n=2, prompt_len=2, response_len=3, version=buf.version())
            same = next(uninformative)
            for trajectory, reward in zip(group.trajectories, [1.0, 1.0 if same else 0.0], strict=True):
                trajectory.reward = reward
            if same:
                put_uninformative.add(group.group_id)
            assert buf.put_group(group, claim.entry_id)
        assert len(batch) == g
        for t in batch:
            assert informative(t.group)
            assert u - t.group.release_version <= s
            assert u - t.group.min_version() <= s
        consumed.update(t.group.group_id for t in batch)
        buf.ack([t.entry_id for t in batch])
        buf.publish_version(u + 1)
    inflight = set(buf.inflight())
    dropped = put_uninformative - inflight
    assert all(count == 1 for count in consumed.values()) and not set(consumed) & put_uninformative
    assert buf.dropped_count() == assembler.dropped == len(dropped)
    released = {p.group_id for p in dataset[: feeder.cursor]}
    assert released == set(consumed) | dropped | inflight  # nothing lost
    buf.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_staleness=st.integers(0, 3),
    groups_per_step=st.integers(1, 3),
    steps=st.integers(2, 5),
    choices=st.lists(st.integers(0, 1_000), min_size=60, max_size=60),
    fates=st.lists(st.sampled_from(["train", "fail", "untrainable"]), min_size=1, max_size=8),
)
def test_dead_lettered_groups_are_replaced_within_the_bound(
    redis_url, max_staleness, groups_per_step, steps, choices, fates
):
    """Lost work: the adversary also picks prompts that fail on every try (dead-lettered by the buffer after
    max_prompt_deliveries) and groups the learner cannot train (dead-lettered when taken). Each is replaced by a new
    release; every batch still holds groups_per_step groups within max_staleness, and every released group is trained
    once, dead-lettered, or still in flight."""
    s, g = max_staleness, groups_per_step
    buf = ReplayBuffer(redis_url, f"hyp-dl-{uuid.uuid4().hex[:8]}", max_prompt_deliveries=2)
    dataset = [make_prompt(i) for i in range(2_000)]
    feeder = PromptFeeder(buf, iter(dataset), groups_per_step=g, max_staleness=s)
    marked: set[str] = set()  # groups put that the learner will refuse
    assembler = BatchAssembler(
        buf,
        groups_per_step=g,
        max_staleness=s,
        replenish=feeder.pump,
        untrainable=lambda group: "refused" if group.group_id in marked else None,
    )
    fate_of: dict[str, str] = {}
    next_fate = itertools.cycle([*fates, "train"])  # at least one trainable group in every cycle
    leased = []
    picks = itertools.cycle(choices)
    consumed: Counter[str] = Counter()
    for u in range(steps):
        feeder.pump()
        assert (
            buf.released_count()
            <= admission_limit(u, groups_per_step=g, max_staleness=s) + buf.replaced_count()
        )
        empty_before = False
        while not (batch := assembler.next_batch(u, timeout_s=0)):
            got = buf.claim_prompts(
                "gen", 100
            )  # retries included; a dead letter's replacement comes next round
            assert leased or got or not empty_before, f"step {u} waits for a group no generator holds"
            empty_before = not (leased or got)
            leased += got
            if not leased:
                continue
            claim = leased.pop(next(picks) % len(leased))
            if claim.prompt.group_id not in fate_of:  # a retry keeps its prompt's fate
                fate_of[claim.prompt.group_id] = next(next_fate)
            fate = fate_of[claim.prompt.group_id]
            if fate == "fail":
                buf.fail_prompt("gen", claim.entry_id, "boom")
                continue
            if fate == "untrainable":
                marked.add(claim.prompt.group_id)
            assert buf.put_group(
                make_group(claim.prompt, n=2, prompt_len=2, response_len=3, version=buf.version()),
                claim.entry_id,
            )
        assert len(batch) == g
        for t in batch:
            assert t.group.group_id not in marked
            assert u - t.group.release_version <= s
            assert u - t.group.min_version() <= s
        consumed.update(t.group.group_id for t in batch)
        buf.ack([t.entry_id for t in batch])
        buf.publish_version(u + 1)
    dead = {d["gid"] for d in buf.dead_letters(10_000)}
    stats = buf.stats()
    assert (
        stats["buffer/abandoned_groups"]
        == len(dead)
        == stats["buffer/failed_prompts"] + stats["buffer/untrainable"]
    )
    assert all(count == 1 for count in consumed.values()) and not set(consumed) & dead
    released = {p.group_id for p in dataset[: feeder.cursor]}
    assert released == set(consumed) | dead | set(buf.inflight())  # nothing lost
    buf.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    floor=st.integers(0, 2),
    span=st.integers(0, 3),
    groups_per_step=st.integers(1, 3),
    steps=st.integers(2, 9),
    kls=st.lists(st.sampled_from([0.0, 0.01, 0.09, 0.11, 0.5, float("nan")]), min_size=9, max_size=9),
    early=st.lists(st.integers(0, 4), min_size=9, max_size=9),
    choices=st.lists(st.integers(0, 1_000), min_size=60, max_size=60),
)
def test_an_adaptive_bound_keeps_every_token_within_the_bound_in_force(
    redis_url, floor, span, groups_per_step, steps, kls, early, choices
):
    """`learner.max_staleness: auto`: the real controller moves the bound after every step from an adversarial
    sequence of mismatch measurements (target 0.1), and the adversary also picks when generators finish (some groups
    before the learner asks, the rest in any order). No trained token is older than the bound its prompt was released
    under, nor than the bound in force for its step; the trainer's own check agrees; the bound stays in
    [floor, ceiling]; every batch is full; every group is trained exactly once."""
    from buffer.auto_staleness import StalenessAutoConfig, StalenessController
    from buffer.staleness import StalenessSchedule, StepBounds, check_staleness

    g, ceiling = groups_per_step, floor + span
    controller = StalenessController(
        StalenessAutoConfig(floor=floor, ceiling=ceiling, initial=ceiling, target_kl=0.1, patience=1)
    )
    schedule = StalenessSchedule(controller.bound)
    buf = ReplayBuffer(redis_url, f"hyp-auto-{uuid.uuid4().hex[:8]}")
    dataset = [make_prompt(i) for i in range(steps * g)]
    feeder = PromptFeeder(buf, iter(dataset), groups_per_step=g, max_staleness=schedule)
    assembler = BatchAssembler(buf, groups_per_step=g, max_staleness=schedule)
    leased = []
    picks = iter(choices * 10)
    consumed: Counter[str] = Counter()
    release_of: dict[str, int] = {}  # every group released so far -> its release version

    def finish_one() -> None:
        claim = leased.pop(next(picks) % len(leased))  # the adversary picks who finishes next
        group = make_group(claim.prompt, n=1, prompt_len=2, response_len=3, version=buf.version())
        assert buf.put_group(group, claim.entry_id)

    for u in range(steps):
        feeder.pump()
        # releases happen only while the rule allows them (a lowered bound stops them until the version catches up),
        # so at most (D + 1) * G released groups ever have a deadline <= D
        assert buf.released_count() <= max(
            admission_limit(r, groups_per_step=g, max_staleness=schedule.at(r)) for r in range(u + 1)
        )
        release_of |= buf.inflight()
        deadlines = Counter(schedule.deadline(r) for r in release_of.values())
        for d in deadlines:
            assert sum(n for e, n in deadlines.items() if e <= d) <= (d + 1) * g
        leased += buf.claim_prompts("gen", 100)
        for _ in range(min(early[u], len(leased))):
            finish_one()
        while not (batch := assembler.next_batch(u, timeout_s=0)):
            assert leased, f"step {u} waits for a group no generator holds"
            finish_one()
        assert len(batch) == g
        in_force = schedule.in_force(u)
        assert floor <= in_force <= ceiling
        for t in batch:
            released_under = schedule.at(t.group.release_version)
            assert u - t.group.min_version() <= released_under <= in_force
        groups = [t.group for t in batch]
        bounds = StepBounds(in_force, {gr.release_version: schedule.at(gr.release_version) for gr in groups})
        assert check_staleness(groups, u, bounds).max() <= in_force
        bound = controller.observe({"loss/offpolicy_kl": kls[u]})
        assert floor <= bound <= ceiling
        schedule.set(u + 1, bound)  # at the step boundary, before version u + 1 is published
        consumed.update(gr.group_id for gr in groups)
        buf.ack([t.entry_id for t in batch])
        buf.publish_version(u + 1)
    assert consumed == Counter(p.group_id for p in dataset)  # each exactly once, none left behind
    buf.close()
