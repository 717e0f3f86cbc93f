"""Every RL method through the real learner loop for a few steps: the buffer, admission, the step, the weights pushed
to a stand-in generator pool (tests/fakes/toy_generator.py), metrics and the final checkpoint. A smoke test: that
each method learns on the tiny world is `scripts/bench/compare_algorithms.py`'s job (an hour of CPU, not CI)."""

from __future__ import annotations

import json

import pytest

STEPS = 3
METHODS = {
    "grpo": [],
    "drgrpo": ["learner.algorithm.type=drgrpo"],
    "rloo": ["learner.algorithm.type=rloo"],
    "reinforce_baseline": ["learner.algorithm.type=reinforce_baseline"],
    "reinforce_pp": ["learner.algorithm.type=reinforce_pp"],
    "ppo": [
        "learner.algorithm.type=ppo",
        "learner.algorithm.critic.lr=1e-3",
        "learner.ppo_mini_batch_size=8",
    ],
    "grpo_dynamic_sampling": ["learner.algorithm.dynamic_sampling=true"],
}


# learner.lora (docs/lora.md): each algorithm again with adapters on a frozen base; the KL reference (kl_coef > 0)
# is the same model with its adapters off
LORA_METHODS = ["grpo", "drgrpo", "rloo", "reinforce_pp", "ppo"]
LORA = ["learner.lora={rank: 8, alpha: 16}", "learner.lr=1e-2", "learner.algorithm.kl_coef=0.01"]
CASES = [(m, False) for m in METHODS] + [(m, True) for m in LORA_METHODS]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("method", "lora"), CASES, ids=[m + ("-lora" if lora else "") for m, lora in CASES])
def test_method_runs_through_the_learner_loop(method, lora, tiny_model_dir, redis_url, tmp_path):
    import torch

    from config import load_config
    from fakes.groups import toy_prompts
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.loop import run_learner
    from tests.fakes.toy_generator import ToyGenerator

    namespace = f"algo-{method}{'-lora' if lora else ''}"
    config = load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"run_dir={tmp_path / 'run'}",
            f"buffer.namespace={namespace}",
            "generators.group_size=4",
            "learner.groups_per_step=4",
            "learner.max_staleness=1",
            f"learner.total_steps={STEPS}",
            "learner.lr=1e-3",
            "learner.warmup_steps=0",
            "learner.micro_batch_tokens=512",
            "learner.checkpoint_every=1000",
            "learner.num_engines=0",
            "eval.every_steps=0",  # no generator here answers evaluation requests
            *METHODS[method],
            *(LORA if lora else []),
        ],
    )
    # one target token in eight: most groups of four are all wrong, which dynamic sampling drops
    generator = ToyGenerator(
        redis_url, namespace, group_size=4, targets=set(range(64)), model_dir=tiny_model_dir, seed=0
    ).start()
    published: list[list[str]] = []  # the names of each publish's tensors

    def sink(version: int, named) -> None:
        named = list(named)
        published.append([name for name, _ in named])
        generator.load_weights(version, named)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    world = init_distributed("cpu")
    try:
        job = config.learner_job().model_copy(
            update={"buffer": config.buffer.model_copy(update={"redis_url": redis_url})}
        )
        version = run_learner(job, world, prompts=toy_prompts(400), weight_sink=sink)
    finally:
        generator.stop()
        shutdown_distributed()
        torch.set_num_threads(threads)
    assert version == STEPS
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    assert [r["learner/version"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["staleness/max"] <= 1 and r["batch/groups"] == 4 for r in steps)
    final = tmp_path / "run" / "checkpoints" / f"step_{STEPS}"
    assert (final / "model.safetensors").is_file()  # with LoRA: the merged model, exported at the end
    assert (final / "adapter" / "adapter_model.safetensors").is_file() == lora
    if lora:
        assert steps[-1]["loss/kl_ref"] != 0  # the adapters moved the policy off its reference (the base)
        assert published and all(".lora_" in name for names in published for name in names)
    if method == "ppo":
        assert all("critic/value_loss" in r and r["perf/updates"] == 2 for r in steps)
    if method == "grpo_dynamic_sampling":
        assert all(r["batch/zero_adv_groups"] == 0 for r in steps)  # every kept group is informative
        assert steps[-1]["buffer/dropped_groups"] > 0
