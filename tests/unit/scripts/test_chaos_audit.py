"""The chaos runs' audit (`verify` in scripts/chaos/base.py: nothing lost, nothing trained twice) on a run whose
Redis forgot the released ids of checkpointed groups: it reads them from the run's record beside Redis's set (the runs
themselves: tests/integration/test_chaos.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from buffer.admission import PromptFeeder
from buffer.group_ids import RELEASED_RECORD
from buffer.redis_buffer import ReplayBuffer
from fakes.groups import make_group, make_prompt
from sr1.launch.redis_server import LocalRedis


def _base():
    from scripts.chaos import base

    return base


def test_the_audit_finds_every_released_group_including_those_redis_forgot(tmp_path):
    base = _base()
    run_dir = tmp_path / "run"
    server = LocalRedis(run_dir / "redis").start()
    buf = ReplayBuffer(server.url, "sr1")
    feeder = PromptFeeder(buf, [make_prompt(i) for i in range(20)], groups_per_step=2, max_staleness=1)
    feeder.pump()  # 4 groups at version 0
    for c in buf.claim_prompts("gen-0", 4):
        buf.put_group(make_group(c.prompt, n=2, response_len=5), c.entry_id)
    taken = buf.take(4, block_ms=0)
    ids = [t.group.group_id for t in taken]
    buf.publish_version(2)
    buf.ack_durable([t.entry_id for t in taken], ids, version=2)  # step_2 holds both steps
    buf.forget_ids(feeder.cursor, 2, record=run_dir / RELEASED_RECORD)
    feeder.pump()  # 2 more at version 2, still in flight at the end
    buf.close()
    server.stop()
    steps = [{"version": 1, "group_ids": ids[:2]}, {"version": 2, "group_ids": ids[2:]}]

    def audit(trained_steps: list[dict]):
        lines = [json.dumps(s) for s in trained_steps]
        (run_dir / "learner_groups.jsonl").write_text("\n".join(lines) + "\n")
        return base.verify(SimpleNamespace(seen=set(), run_dir=run_dir), 0, 2, 1, [])

    verdict = audit(steps)
    assert verdict.completed and verdict.lost == 0 and verdict.trained_twice == 0 and verdict.ok
    # a group released and forgotten by Redis that no step trained: lost, found through the record
    assert audit([steps[0], {"version": 2, "group_ids": ids[2:3]}]).lost == 1
    assert audit([steps[0], {"version": 2, "group_ids": ids[1:]}]).trained_twice == 1
