"""One name, one meaning: run every emitter of metrics, check that each key it reports is documented in
docs/metrics.md, docs/metrics-pools.md or, for Search-R1's names, docs/search-r1.md (exactly one row), that no two
emitters report the same key, and that every documented key is emitted by someone."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
SEARCH_R1_DOC = DOC.with_name("search-r1.md")  # its Metrics section: Search-R1's names for sr1's metrics


def search_r1_names_section() -> str:
    return SEARCH_R1_DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]


def documented() -> list[str]:
    """Every documented key: docs/metrics.md's rows and the Search-R1 names of docs/search-r1.md."""
    pages = DOC.read_text() + DOC.with_name("metrics-pools.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|", pages, flags=re.MULTILINE)
    return rows + re.findall(r"^\| `([^`]+)` \|", search_r1_names_section(), flags=re.MULTILINE)


def _pattern(key: str) -> re.Pattern:
    return re.compile(
        "^" + re.sub(r"<[^>]+>", "[^/]+", re.escape(key).replace(r"\<", "<").replace(r"\>", ">")) + "$"
    )


def rows_matching(key: str, rows: list[str]) -> list[str]:
    """The row documenting `key`: its own row if it has one, else the most specific pattern rows it fits (the most
    literal text: `eval/finish/<reason>` documents `eval/finish/eos`, not `eval/<metric>/<source>`)."""
    if key in rows:
        return [key]
    fits = [row for row in rows if _pattern(row).match(key)]
    literal = {row: len(re.sub(r"<[^>]+>", "", row)) for row in fits}
    most = max(literal.values(), default=0)
    return [row for row in fits if literal[row] == most]


@pytest.fixture(scope="module")
def emitted(world, tiny_model_dir, redis_server, tmp_path_factory) -> dict[str, set[str]]:
    """The keys each emitter reports, from the real code."""
    from buffer.redis_buffer import ReplayBuffer
    from buffer.stats import pool_metrics
    from evaluation import compact_item, merge_answers
    from fakes.groups import make_group, make_prompt, random_groups
    from generators.evaluation import answer_shard
    from generators.settings import GeneratorsConfig
    from generators.worker import GeneratorWorker
    from learner.checkpoints.checkpointer import Checkpointer
    from learner.checkpoints.safety_net import SafetyNet
    from learner.settings import LearnerConfig
    from learner.steps import step_timing, tool_metrics
    from learner.tracking import metric_aliases
    from learner.trainer import Learner
    from tasks.search_r1 import SearchR1Task
    from tests.fakes.engine import ScriptedEngine, ToyTokenizer
    from weight_sync.publisher import WeightPublisher
    from weight_sync.settings import WeightSyncConfig

    out: dict[str, set[str]] = {}
    learner = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    out["trainer"] = set(
        learner.train_step(random_groups(np.random.default_rng(0), n_groups=2, group_size=3))
    )
    # PPO's step adds the critic's keys
    ppo = Learner(
        LearnerConfig(groups_per_step=2, micro_batch_tokens=512, algorithm="ppo"), tiny_model_dir, world
    )
    out["trainer"] |= set(ppo.train_step(random_groups(np.random.default_rng(0), n_groups=2, group_size=3)))
    out["publisher"] = set(WeightPublisher(None, WeightSyncConfig(), num_engines=0).publish([], version=1))
    out["loop"] = set(step_timing(1.0, 0.5, 0.2)) | set(tool_metrics([make_group(make_prompt(0), n=2)]))
    out["loop"] |= set(
        SafetyNet(Checkpointer(tmp_path_factory.mktemp("net"), world, tiny_model_dir), 4).metrics()
    )

    buffer = ReplayBuffer(redis_server.url, "metric-keys")
    prompt = make_prompt(0)
    buffer.release_prompts([prompt])
    buffer.put_group(make_group(prompt, n=2, response_len=20), buffer.claim_prompts("g", 1)[0].entry_id)
    buffer.record_consumed([0, 1])
    out["buffer"] = set(buffer.stats())

    tok = ToyTokenizer()
    answer = ("<think> a </think> <answer> x </answer>", "stop")
    cfg = GeneratorsConfig(max_turns=1, max_tokens_per_turn=16, max_obs_tokens=16, max_response_tokens=64)
    worker = GeneratorWorker(
        cfg,
        buffer,
        ScriptedEngine(tok, [], repeat=[answer]),
        tok,
        SearchR1Task(),
        worker_id="w",
        max_model_len=128,
        chat_template=False,
    )
    worker.finish_reasons["answer"] += 1
    out["generator"] = set(worker.metrics())
    out["pool"] = set(pool_metrics([{"role": "generator", "metrics": worker.metrics()}]))
    result = asyncio.run(
        answer_shard(
            ScriptedEngine(tok, [], repeat=[answer]),
            [prompt],
            SearchR1Task(),
            tok,
            cfg,
            max_model_len=128,
            chat_template=False,
            return_items=True,
        )
    )
    sampled = asyncio.run(
        answer_shard(
            ScriptedEngine(tok, [], repeat=[answer]),
            [prompt],
            SearchR1Task(),
            tok,
            cfg,
            max_model_len=128,
            chat_template=False,
            greedy=False,
            samples=2,
        )
    )
    # what a worker posts for its shard, merged by whoever asked
    shard_result = {
        "items": [compact_item(i) for i in result.pop("items")],
        "eval/version": 0,
        "eval/seconds": 1.0,
    }
    out["evaluation"] = set(result) | set(sampled) | set(merge_answers([shard_result]))
    buffer.close()
    # the tracker logs Search-R1's names beside sr1's (learner/tracking.py)
    out["search_r1_names"] = set(metric_aliases(dict.fromkeys(set().union(*out.values()), 0.0)))
    return out


def test_every_emitted_key_is_documented_once(emitted):
    rows = documented()
    assert len(rows) == len(set(rows)), "a key is documented twice"
    for emitter, keys in emitted.items():
        for key in keys:
            assert len(rows_matching(key, rows)) == 1, (
                f"{emitter} reports {key!r}: documented rows {rows_matching(key, rows)}"
            )


def test_no_two_emitters_report_the_same_key(emitted):
    names = sorted(emitted)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not emitted[a] & emitted[b], f"{a} and {b} both report {sorted(emitted[a] & emitted[b])}"


def test_every_documented_key_is_emitted(emitted):
    keys = set().union(*emitted.values())
    for row in documented():
        assert any(_pattern(row).match(k) for k in keys), (
            f"docs/metrics.md lists {row!r} but nothing reports it"
        )


def test_a_row_with_a_clash_is_refused():
    from learner.tracking import merge_metrics

    assert merge_metrics({"a/x": 1}, {"b/y": 2}) == {"a/x": 1, "b/y": 2}
    with pytest.raises(ValueError, match="a/x"):
        merge_metrics({"a/x": 1}, {"a/x": 2})


def test_the_search_r1_names_in_the_doc_are_the_trackers():
    from learner.tracking import METRIC_ALIAS_PREFIXES, METRIC_ALIASES

    section = search_r1_names_section()
    pairs = dict(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", section, flags=re.MULTILINE))
    expected = {theirs: ours for ours, theirs in METRIC_ALIASES.items()}
    expected |= {f"{theirs}<source>": f"{ours}<source>" for ours, theirs in METRIC_ALIAS_PREFIXES.items()}
    assert pairs == expected
