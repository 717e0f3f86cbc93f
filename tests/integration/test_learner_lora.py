"""LoRA on real FSDP2 gloo ranks (learner.lora, docs/lora.md): two ranks train the same adapters as one, every rank
takes part in the probe and the adapters' gathers of a publish, and a LoRA run killed with a torn checkpoint resumes
from the one before through the real learner process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

STEPS = 3
LORA = {"rank": 4, "alpha": 8.0}

pytestmark = pytest.mark.slow  # several processes: `make test-fast` leaves it out


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, out: str) -> None:
    from fakes.groups import random_groups
    from learner.settings import LearnerConfig
    from learner.trainer import Learner
    from tests.fakes.gloo import gloo_rank
    from weight_sync.publisher import gather_for_wire, gather_in_step

    with gloo_rank(rank, world_size, port) as world:
        cfg = LearnerConfig(
            groups_per_step=4, lr=1e-2, micro_batch_tokens=80, max_staleness=1, lora=LORA, correction="tis"
        )
        learner = Learner(cfg, model_dir, world, seed=0, model_dtype="bfloat16")
        rng = np.random.default_rng(0)  # the same batches on every rank and in both runs
        history, probes = [], []
        for step in range(STEPS):
            groups = random_groups(rng, n_groups=4, group_size=3, version=max(0, step - 1))
            metrics = learner.train_step(groups)
            history.append({k: metrics[k] for k in ("loss/pg", "loss/grad_norm", "loss/entropy")})
            # a publish as learner/loop.py makes it: the probe, then the adapters' gathers, on every rank
            probes.append(learner.publish_extras()["probe"])
            if rank == 0:
                wire = {n: gather_for_wire(t.detach(), None) for n, t in learner.published_weights()}
            else:
                gather_in_step(learner.published_weights(), None)
        if rank == 0:
            summary = {n: float(t.double().abs().sum()) for n, t in wire.items()}
            Path(out).write_text(json.dumps({"history": history, "probes": probes, "wire": summary}))


def _run(world_size: int, port: int, model_dir: Path, out: Path) -> dict:
    from tests.fakes.gloo import run_ranks

    run_ranks(_rank_main, world_size, port, str(model_dir), str(out))
    return json.loads(out.read_text())


@pytest.mark.timeout(300)
def test_two_gloo_ranks_train_and_publish_the_same_adapters_as_one(tiny_model_dir, tmp_path, free_port):
    one = _run(1, free_port, tiny_model_dir, tmp_path / "one.json")
    two = _run(2, free_port, tiny_model_dir, tmp_path / "two.json")
    # bf16 compute: two ranks sum partial results in another order (measured: grad norms 0.1 % apart by step 2)
    for step, (a, b) in enumerate(zip(one["history"], two["history"], strict=True)):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-2, abs=1e-4), f"step {step} {key}"
    assert one["wire"].keys() == two["wire"].keys()
    assert all(name.startswith("base_model.model.model.layers.") for name in one["wire"])
    assert all(".lora_A." in n or ".lora_B." in n for n in one["wire"])
    for name, value in one["wire"].items():
        assert value == pytest.approx(two["wire"][name], rel=1e-2), name
    for a, b in zip(one["probes"], two["probes"], strict=True):
        assert a["token_ids"] == b["token_ids"]
        np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=2e-2)
    assert one["probes"][0]["logprobs"] != one["probes"][-1]["logprobs"]  # the adapters moved the policy


@pytest.mark.timeout(400)
def test_a_lora_run_resumes_past_a_torn_checkpoint(tiny_model_dir, redis_url, tmp_path):
    """Killed once step_8 exists, step_8's adapter and resume files cut to half their size, resumed: the learner
    names what is torn, loads step_4's adapters and AdamW state, and the run's final checkpoint exports the adapter
    and the merged model."""
    from learner.checkpoints.files import MANIFEST
    from tests.fakes.toy_generator import ToyGenerator
    from tests.integration.test_learner_resume import (
        _assert_every_group_once,
        _run_config,
        _start,
        _stop,
        _when_latest_is,
    )

    namespace, total = "lora-torn", 12
    config_path, run_dir = _run_config(
        tmp_path,
        tiny_model_dir,
        namespace,
        "learner.max_staleness=1",
        f"learner.total_steps={total}",
        "learner.checkpoint_every=4",
        "learner.lora={rank: 4, alpha: 8}",
        "learner.lr=1e-3",
    )
    log = tmp_path / "learner.log"
    generator = ToyGenerator(redis_url, namespace, group_size=2, targets={1, 2, 3}, response_len=3).start()
    try:
        first = _start(config_path, redis_url, log=log)
        _when_latest_is(first, run_dir, "step_8")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        step_8 = run_dir / "checkpoints" / "step_8"
        assert not (step_8 / "model.safetensors").exists()  # adapters only mid-run
        cut = [p for p in step_8.rglob("*") if p.is_file() and p.stat().st_size > 4096 and p.name != MANIFEST]
        assert any(p.parent.name == "adapter" for p in cut)
        for path in cut:
            os.truncate(path, path.stat().st_size // 2)
        second = _start(config_path, redis_url, "--resume", log=log)
        assert second.wait(180) == 0, log.read_text()[-3000:]
    finally:
        _stop(generator, [p for p in locals().values() if isinstance(p, subprocess.Popen)])
    text = log.read_text()
    assert f"skipping checkpoint {step_8}" in text and "resuming from step_4" in text
    final = run_dir / "checkpoints" / f"step_{total}"
    assert (final / "adapter" / "adapter_model.safetensors").is_file()
    assert (final / "model.safetensors").is_file() and (final / "config.json").is_file()
    _assert_every_group_once(run_dir, redis_url, namespace, generator, total)
