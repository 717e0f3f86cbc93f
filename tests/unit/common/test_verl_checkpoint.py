"""verl FSDP actor checkpoints load wherever a model path is taken, and sr1's checkpoints load the way Search-R1's
`infer.py` loads a model. The verl checkpoint is written the way verl's FSDP checkpoint manager writes one: two gloo
ranks shard a tiny model with FSDP2 and each saves its sharded state dict; `huggingface/` holds config and tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from common.model_paths import ModelPathError, resolve_model_path

WORLD_SIZE = 2


def _save_rank(rank: int, model_dir: str, actor: str, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from learner.distributed import shutdown_distributed

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        mesh = init_device_mesh("cpu", (WORLD_SIZE,), mesh_dim_names=("fsdp",))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        torch.save(model.state_dict(), Path(actor) / f"model_world_size_{WORLD_SIZE}_rank_{rank}.pt")
        shutdown_distributed()  # the ranks leave together
    finally:
        shutdown_distributed(wait_for_peers=False)  # after an error (a no-op after a normal end)


@pytest.fixture(scope="module")
def verl_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """`<root>/global_step_3/actor/` as verl saves it (model shards, optimizer stand-ins, huggingface/)."""
    import socket

    step = tmp_path_factory.mktemp("verl") / "global_step_3"
    actor = step / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            shutil.copy(f, actor / "huggingface" / f.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _save_rank, args=(str(tiny_model_dir), str(actor), port), nprocs=WORLD_SIZE, start_method="spawn"
    )
    for rank in range(WORLD_SIZE):
        torch.save({}, actor / f"optim_world_size_{WORLD_SIZE}_rank_{rank}.pt")
    return step


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sr1"


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_shards_are_sharded_and_merge_into_the_model(verl_checkpoint, tiny_model_dir, cache):
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shard = torch.load(verl_checkpoint / "actor" / "model_world_size_2_rank_1.pt", weights_only=True)
    embed = shard["model.embed_tokens.weight"]
    assert isinstance(embed, DTensor) and embed.to_local().shape[0] < embed.shape[0]  # really a shard

    for given in (verl_checkpoint, verl_checkpoint / "actor"):  # global_step_<N> or its actor/
        merged = resolve_model_path(given)
        assert merged.is_relative_to(cache) and (merged / "model.safetensors").is_file()
    original = _weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32))
    loaded = _weights(AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32))
    assert loaded.keys() == original.keys()
    assert all(torch.equal(loaded[k], original[k]) for k in original)  # merging moves bytes: exact
    assert (
        AutoTokenizer.from_pretrained(merged)("<search>")["input_ids"]
        == (AutoTokenizer.from_pretrained(tiny_model_dir)("<search>")["input_ids"])
    )


def test_a_checkpoint_is_merged_once(verl_checkpoint, cache):
    first = resolve_model_path(verl_checkpoint)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(verl_checkpoint) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in cache.joinpath("verl").iterdir()] == [first.name]  # no staging directory left


def test_a_broken_checkpoint_is_a_clear_error(verl_checkpoint, tmp_path, cache):
    broken = tmp_path / "broken" / "actor"
    shutil.copytree(verl_checkpoint / "actor", broken)
    (broken / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(ModelPathError, match="model_world_size_2_rank_1.pt missing"):
        resolve_model_path(broken.parent)
    shutil.rmtree(broken / "huggingface")
    with pytest.raises(ModelPathError, match="no huggingface/config.json"):
        resolve_model_path(broken)


def test_sr1_eval_takes_a_verl_checkpoint(verl_checkpoint, tmp_path, cache):
    from sr1.evaluate import main

    test_file = tmp_path / "test.jsonl"
    rows = [{"question": f"who founded alpha {w}?", "golden_answers": ["cedar"]} for w in ("bravo", "delta")]
    test_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    argv = [
        "--checkpoint",
        str(verl_checkpoint),
        "--engine",
        "hf",
        "--mode",
        "direct",
        "--test-files",
        str(test_file),
        "--out",
        str(out),
        "model.chat_template=false",
        "generators.max_tokens_per_turn=8",
    ]
    assert main(argv) == 0
    assert list(out.iterdir())  # the evaluation wrote its results


def test_sr1_checkpoints_load_as_search_r1_infer_loads_a_model(tiny_model_dir, world, tmp_path):
    """Search-R1's infer.py: AutoTokenizer + AutoModelForCausalLM from the directory, nothing else."""
    import transformers

    from learner.checkpoints.checkpointer import Checkpointer, ResumeState
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    learner = Learner(LearnerConfig(groups_per_step=1, micro_batch_tokens=512), tiny_model_dir, world)
    checkpointer = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, save_dtype="bfloat16")
    path = checkpointer.save(learner.model, learner.optimizer, learner.scheduler, ResumeState(version=1))
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
    ids = tokenizer("Question: who founded alpha bravo? <think>", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_sr1_ask_merges_a_verl_checkpoint_or_names_what_is_wrong(
    verl_checkpoint, tmp_path, cache, capsys, monkeypatch
):
    import sr1.ask

    asked = {}

    async def fake_ask(
        question, checkpoint, url, cfg, engine
    ):  # the answering itself needs a retrieval server
        asked["checkpoint"] = checkpoint

    monkeypatch.setattr(sr1.ask, "ask", fake_ask)
    assert sr1.ask.main(["who?", "--checkpoint", str(verl_checkpoint)]) == 0
    assert (asked["checkpoint"] / "model.safetensors").is_file() and asked["checkpoint"].is_relative_to(cache)
    broken = tmp_path / "broken"
    shutil.copytree(verl_checkpoint / "actor", broken)
    shutil.rmtree(broken / "huggingface")
    assert sr1.ask.main(["who?", "--checkpoint", str(broken)]) == 2
    assert "no huggingface/config.json" in capsys.readouterr().err


class _Touch:
    """Unpickles as `Path(marker).touch()`: what a hostile shard could run instead (any callable, any argument)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_shard_that_would_run_code_when_unpickled_is_refused_not_run(verl_checkpoint, tmp_path, cache):
    hostile = tmp_path / "hostile" / "actor"
    shutil.copytree(verl_checkpoint / "actor", hostile)
    marker = tmp_path / "code-ran"
    shard = hostile / "model_world_size_2_rank_1.pt"
    state = torch.load(shard, weights_only=True)  # DTensors load with the weights-only unpickler as they are
    state["model.norm.weight"] = _Touch(marker)
    torch.save(state, shard)
    with pytest.raises(ModelPathError, match="refused") as caught:
        resolve_model_path(hostile.parent)
    assert not marker.exists()  # nothing in the file ran
    assert "verl.model_merger merge --backend fsdp" in str(caught.value) and str(hostile) in str(caught.value)
