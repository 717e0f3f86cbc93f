"""How the learner runs on this device, decided once before any model is loaded and logged: the packed-row
attention kernel, compiled decoder layers, the log-prob head, the activation-checkpointing policy and FSDP2's
reshard and gradient-sync settings.

    execution = plan_execution(cfg.learner, model_path, world, "bfloat16", reference=True, critic=False)
    load_policy(..., **execution.load_options())

On CUDA the choices follow the GPU: `attention: auto` times the kernels present (learner/execution/attention_choice.py),
`compile: auto` compiles unless the attention is the per-sequence loop, `logprob_head: auto` is the fused head, and
learner/execution/memory.py's estimate of the step's peak picks the checkpointing policy (`auto`) and whether
parameters stay unsharded through an update and gradient sync waits for its last micro-batch; a micro-batch budget
that cannot fit fails here, naming the budget that would. On CPU: the loop, eager layers, the chunked head, no
checkpointing (for `auto`), the sync on the last micro-batch, as before, and at world size 1 parameters kept unsharded
through an update when a copy of the layers takes under a tenth of the available memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from learner.distributed import World
from learner.execution.attention_choice import choose_attention
from learner.execution.compiled import resolve_compile
from learner.execution.fused_head import resolve_logprob_head
from learner.execution.memory import (
    MemoryPlan,
    MemorySettings,
    StepShape,
    check_micro_batch_fits,
    memory_of,
    plan_memory,
)
from learner.lora import lora_parameters
from learner.model import DTYPES
from learner.settings import LearnerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Execution:
    attention: str
    compile: bool
    logprob_head: str  # fused | chunked
    checkpointing: str  # full | every_n | selective | none
    checkpointing_every: int
    keep_unsharded: bool  # FSDP2: no reshard after forward, nor between the micro-batches of an update
    defer_grad_sync: bool  # FSDP2: reduce-scatter on an update's last micro-batch only
    attention_seconds: dict[str, float] = field(default_factory=dict)  # what auto measured
    memory: MemoryPlan | None = None  # the estimate behind the choices (CUDA)

    def load_options(self) -> dict:
        """The keyword arguments of learner.model.load_policy for a trained model."""
        return {
            "attention": self.attention,
            "compile": self.compile,
            "gradient_checkpointing": self.checkpointing,
            "checkpointing_every": self.checkpointing_every,
            "reshard_after_forward": not self.keep_unsharded,
        }

    def describe(self) -> str:
        measured = (
            " (measured: "
            + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in self.attention_seconds.items())
            + ")"
            if self.attention_seconds
            else ""
        )
        checkpointing = self.checkpointing + (
            f" every {self.checkpointing_every}" if self.checkpointing == "every_n" else ""
        )
        parameters = "kept unsharded through an update" if self.keep_unsharded else "resharded after use"
        sync = "on an update's last micro-batch" if self.defer_grad_sync else "every micro-batch"
        return (
            f"attention {self.attention}{measured}; decoder layers {'compiled' if self.compile else 'eager'}; "
            f"log-prob head {self.logprob_head}; activation checkpointing {checkpointing}"
            + (f" [{self.memory.reason}]" if self.memory else "")
            + f"; FSDP2 parameters {parameters}, gradients synced {sync}"
        )


def _model_shape(config) -> tuple[StepShape | None, int, int, int]:
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return StepShape.of(config), heads, kv_heads, head_dim


def _host_holds_a_copy(shape: StepShape | None, compute: torch.dtype) -> bool:
    """On CPU: whether a gathered compute-dtype copy of the layers takes under a tenth of the available memory."""
    import psutil

    if shape is None:
        return False
    return shape.layers * shape.layer_parameters * compute.itemsize < 0.1 * psutil.virtual_memory().available


def _lora_parameters(cfg: LearnerConfig, shape: StepShape | None) -> int:
    """The adapters' parameters under learner.lora (0 without it, or for a model the estimate does not know)."""
    if cfg.lora is None or shape is None:
        return 0
    return lora_parameters(shape.hidden, shape.kv, shape.intermediate, shape.layers, cfg.lora)


def plan_execution(
    cfg: LearnerConfig,
    model_path: str | Path,
    world: World,
    dtype: str,
    *,
    reference: bool,
    critic: bool,
    attention: str | None = None,
) -> Execution:
    """Resolve the learner's `auto` settings for this device and model (see the module docstring) and log them.
    `attention`: a kernel name that overrides learner.attention (the benchmark's --attention)."""
    from transformers import AutoConfig

    device = world.device
    config = AutoConfig.from_pretrained(str(model_path))
    shape, heads, kv_heads, head_dim = _model_shape(config)
    compute = DTYPES[dtype]
    requested = attention if attention not in (None, "auto") else cfg.attention
    attention_name, seconds = choose_attention(
        device,
        requested,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=compute,
        tokens=cfg.micro_batch_tokens,
    )
    compiled = resolve_compile(cfg.compile, device, attention_name)
    head = resolve_logprob_head(cfg.logprob_head, device)
    settings = MemorySettings(
        world_size=world.world_size,
        compute_bytes=compute.itemsize,
        tokens=cfg.micro_batch_tokens,
        chunk_tokens=cfg.logprob_chunk_tokens,
        checkpointing="none" if cfg.gradient_checkpointing == "auto" else cfg.gradient_checkpointing,
        every=cfg.gradient_checkpointing_every,
        compiled=compiled,
        fused_head=head == "fused",
        cpu_offload=cfg.cpu_offload,
        reference=reference,
        critic=critic,
        keep_unsharded=world.world_size == 1
        and (device.type == "cuda" or _host_holds_a_copy(shape, compute)),
        defer_grad_sync=True,
        lora_parameters=_lora_parameters(cfg, shape),
    )
    plan = None
    if device.type == "cuda" and shape is not None:
        properties = torch.cuda.get_device_properties(device)
        plan = plan_memory(shape, settings, properties.total_memory, requested=cfg.gradient_checkpointing)
        settings = plan.settings
        check_micro_batch_fits(
            memory_of(shape, settings),
            cfg.micro_batch_tokens,
            properties.total_memory,
            properties.name,
            settings.checkpointing,
        )
    elif device.type == "cuda":  # a model the estimate does not know: the settings that need least memory
        log.warning(
            "the memory estimate does not know %s: parameters resharded after use%s",
            type(config).__name__,
            ", activation checkpointing auto -> full" if cfg.gradient_checkpointing == "auto" else "",
        )
        checkpointing = "full" if cfg.gradient_checkpointing == "auto" else settings.checkpointing
        settings = replace(settings, checkpointing=checkpointing, keep_unsharded=False)
    execution = Execution(
        attention=attention_name,
        compile=compiled,
        logprob_head=head,
        checkpointing=settings.checkpointing,
        checkpointing_every=settings.every,
        keep_unsharded=settings.keep_unsharded,
        defer_grad_sync=settings.defer_grad_sync,
        attention_seconds=seconds,
        memory=plan,
    )
    if world.is_main:
        log.info("learner on %s: %s", device, execution.describe())
    return execution
