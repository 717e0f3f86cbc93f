"""The evaluation vocabulary without a model: which prompts are measured, how shards split them, how answers merge."""

from __future__ import annotations

from collections import Counter

import pytest

from buffer.records import PromptRecord
from evaluation import merge_answers, select_prompts, shard


def _prompts(counts: dict[str, int]) -> list[PromptRecord]:
    return [
        PromptRecord(
            group_id=f"{source}/test/{i}/e0",
            question="q",
            prompt=[{"role": "user", "content": f"q {i}"}],
            ground_truth=["x"],
            data_source=source,
            index=i,
            split="test",
        )
        for source, n in counts.items()
        for i in range(n)
    ]


def test_a_capped_evaluation_shares_the_prompts_equally_between_sources():
    prompts = _prompts({"nq": 50, "hotpotqa": 30, "bamboogle": 4})  # NQ first, as in Search-R1's test file
    picked = select_prompts(prompts, max_prompts=30, seed=0)
    by_source = Counter(p.data_source for p in picked)
    assert by_source == {
        "nq": 13,
        "hotpotqa": 13,
        "bamboogle": 4,
    }  # bamboogle's unused share goes to the others
    assert picked == sorted(picked, key=prompts.index)  # file order kept
    assert select_prompts(prompts, max_prompts=30, seed=0) == picked  # seeded: the same every time
    assert select_prompts(prompts, max_prompts=30, seed=1) != picked
    capped = select_prompts(prompts, max_per_source=10, seed=0)
    assert Counter(p.data_source for p in capped) == {"nq": 10, "hotpotqa": 10, "bamboogle": 4}
    assert select_prompts(prompts) == prompts  # no cap: every prompt
    shards = [shard(picked, i, 3) for i in range(3)]
    assert (
        sorted(sum(shards, []), key=prompts.index) == picked and len({id(p) for s in shards for p in s}) == 30
    )


def _item(group: str, source: str, em: float, sample: int = 0, reason: str = "answer") -> dict:
    return {
        "group_id": group,
        "data_source": source,
        "sample": sample,
        "metrics": {"em": em, "reward": em},
        "tool_calls": 1,
        "turns": 2,
        "finish_reason": reason,
    }


def test_shards_merge_into_the_summary_of_one_evaluation_with_pass_at_k():
    shard_a = {
        "items": [_item("q1", "nq", 0.0, 0), _item("q1", "nq", 1.0, 1), _item("q2", "nq", 0.0, 0)],
        "eval/version": 7,
        "eval/seconds": 3.0,
    }
    shard_b = {
        "items": [
            _item("q2", "nq", 0.0, 1, "budget"),
            _item("q3", "hotpotqa", 1.0, 0),
            _item("q3", "hotpotqa", 1.0, 1),
        ],
        "eval/version": 8,
        "eval/seconds": 5.0,
    }
    out = merge_answers([shard_a, shard_b])
    assert out["eval/n"] == 6 and out["eval/em"] == pytest.approx(3 / 6)
    assert out["eval/pass@2/em"] == pytest.approx(2 / 3) and out["eval/pass@2/em/nq"] == 0.5
    assert out["eval/finish/budget"] == pytest.approx(1 / 6) and out["eval/n/hotpotqa"] == 2
    assert (out["eval/version"], out["eval/version_max"], out["eval/workers"]) == (7, 8, 2)
    assert out["eval/seconds"] == 5.0


def test_a_recorded_evaluation_leaves_redis(redis_url, tmp_path):
    """Whoever asked records the merged result in evals.jsonl and deletes the answers: a long run kept every
    evaluation's answers in Redis for a week (found by scripts/chaos/soak.py's key count)."""
    from types import SimpleNamespace

    from buffer.redis_buffer import ReplayBuffer
    from evaluation import Evaluations

    buf = ReplayBuffer(redis_url, "evalgc")
    evals = Evaluations(buf, SimpleNamespace(max_prompts=4, max_per_source=None), tmp_path)
    eval_id = evals.request(step=3)
    request = buf.pop_evaluation_request("gen-0")
    buf.post_evaluation_answer(request, {"items": [_item("q1", "nq", 1.0)], "eval/version": 3})
    assert evals.wait(eval_id, timeout_s=5)["eval/em"] == 1.0
    assert (tmp_path / "evals.jsonl").read_text().count("\n") == 1
    assert buf._redis.keys("evalgc:eval:*") == []  # the request list is empty too, and gone with it
    buf.close()
