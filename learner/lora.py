"""LoRA on the FSDP2 learner (`learner.lora`, docs/lora.md): low-rank adapters trained on a frozen base.

    trainable = inject_lora(model, settings, base_dtype=torch.bfloat16)   # before prepare_layers and fully_shard
    with adapters_disabled(model): ...                                     # the KL reference: the base alone
    adapter_weights(model)            # (PEFT name, sharded tensor): what the engines get, `get_peft_model_state_dict`'s names
    merged_entries(model)             # (HF name, shape, gather): the merged model for the final export

PEFT's `inject_adapter_in_model` swaps each target `nn.Linear` for PEFT's `lora.Linear` (the original layer kept as
its `base_layer`) in place, so the model stays the transformers class the learner already drives: its decoder
layers are still `model.model.layers` for activation checkpointing, `torch.compile` and FSDP2's `fully_shard`, and
`get_decoder()`, `get_output_embeddings()` and the config are the model's own (`get_peft_model` would wrap it in a
`PeftModel` whose `.model` is the causal LM, not its decoder). The adapters are plain submodules of each decoder
layer, so each layer's FSDP2 unit shards them with the base. FSDP2 needs one dtype across a unit's *trainable*
parameters only: the frozen base is cast to the compute dtype (`model.dtype`; bf16 on GPU: 2 bytes a parameter, no
gradient, no optimizer state) while the adapters stay fp32 master weights, and a unit of mixed dtypes is
all-gathered as bytes. The adapters' B starts at zero: version 0 is the base model.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from learner.settings import LoraSettings

log = logging.getLogger(__name__)

ADAPTER_NAME = (
    "default"  # PEFT's name of the one adapter; `get_peft_model_state_dict` leaves it out of the keys
)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# `get_peft_model_state_dict` of a PeftModelForCausalLM: its keys start with these two wrappers' attribute names
PEFT_PREFIX = "base_model.model."

Entry = tuple[str, torch.Size, Callable[[], torch.Tensor]]


def lora_config(settings: LoraSettings):
    """The PEFT `LoraConfig` of `learner.lora`."""
    from peft import LoraConfig

    return LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def adapter_config(settings: LoraSettings, base_model: str = "") -> dict:
    """The adapter's `adapter_config.json` contents (JSON-able), as PEFT writes them: what the update record carries
    (`weight_sync.publisher.check_adapter`) and the exported adapter directory holds."""
    config = lora_config(settings)
    config.base_model_name_or_path = base_model
    raw = config.to_dict()
    out = {}
    for key, value in raw.items():
        if isinstance(value, set):
            value = sorted(value)
        elif hasattr(value, "value"):  # enums (peft_type, task_type)
            value = value.value
        out[key] = value
    out["target_modules"] = list(settings.target_modules)  # the order given, not a set's
    return out


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's PEFT LoRA layers (empty for a model without adapters)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def has_lora(model: torch.nn.Module) -> bool:
    return bool(lora_layers(model))


def inject_lora(model: torch.nn.Module, settings: LoraSettings, base_dtype: torch.dtype) -> int:
    """Put adapters on `settings.target_modules` of `model` in place (before `prepare_layers` and FSDP2), freeze and
    cast every other parameter to `base_dtype`, keep the adapters fp32. Returns the adapters' parameter count.
    Raises ValueError naming the target modules the model lacks."""
    from peft import inject_adapter_in_model

    linear_names = {
        name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)
    }
    missing = [t for t in settings.target_modules if t not in linear_names]
    if missing:
        raise ValueError(
            f"learner.lora.target_modules {missing} name no linear layer of {type(model).__name__}; its linear "
            f"layers are {sorted(linear_names)}"
        )
    inject_adapter_in_model(lora_config(settings), model, adapter_name=ADAPTER_NAME)
    trainable = 0
    for name, param in model.named_parameters():
        if ".lora_" in name:
            param.requires_grad_(True)
            param.data = param.data.to(torch.float32)
            trainable += param.numel()
        else:
            param.requires_grad_(False)
            param.data = param.data.to(base_dtype)
    if trainable == 0:
        raise ValueError(f"learner.lora put no adapter on {type(model).__name__}")
    return trainable


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Within: the model computes as its frozen base (the KL reference, without a second copy of the model).

    Flips PEFT's per-layer switch only: `enable_adapters(False)` would also toggle the adapters' requires_grad,
    which FSDP2 reads once when it first runs a unit."""
    layers = lora_layers(model)
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, state in zip(layers, before, strict=True):
            layer._disable_adapters = state


def peft_name(name: str) -> str:
    """An adapter parameter's name in the learner's model -> `peft.get_peft_model_state_dict`'s name for it
    (`model.layers.0.self_attn.q_proj.lora_A.default.weight` -> `base_model.model.model.layers.0.self_attn.q_proj.
    lora_A.weight`)."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")


def adapter_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(PEFT name, sharded tensor) of every adapter parameter, in state-dict order, identical on every rank: what the
    engines receive. Gather with `.full_tensor()`."""
    for name, tensor in model.state_dict().items():
        if ".lora_A." in name or ".lora_B." in name:
            yield peft_name(name), tensor


def adapter_scaling(settings: LoraSettings) -> float:
    return settings.alpha / settings.rank


def full(tensor: torch.Tensor) -> torch.Tensor:
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor


def merged_entries(
    model: torch.nn.Module, settings: LoraSettings, skip: set[str] | None = None
) -> list[Entry]:
    """The merged model's weights under their Hugging Face names, each as (name, global shape, gather): `gather()`
    (a collective: every rank calls the same ones in the same order) returns the full fp32 tensor, W + alpha/r B A
    for an adapted layer. `skip`: HF names to leave out (a head tied to the embeddings)."""
    state = model.state_dict()
    scale = adapter_scaling(settings)
    entries: list[Entry] = []
    for name, tensor in state.items():
        if ".lora_" in name:
            continue
        hf = name.replace(".base_layer.", ".")
        if skip and hf in skip:
            continue
        prefix = name[: -len(".base_layer.weight")] if name.endswith(".base_layer.weight") else None
        if prefix is not None and f"{prefix}.lora_A.{ADAPTER_NAME}.weight" in state:
            a = state[f"{prefix}.lora_A.{ADAPTER_NAME}.weight"]
            b = state[f"{prefix}.lora_B.{ADAPTER_NAME}.weight"]

            def gather(w=tensor, a=a, b=b) -> torch.Tensor:
                base = full(w.detach()).float()
                return base + scale * (full(b.detach()).float() @ full(a.detach()).float())

        else:

            def gather(w=tensor) -> torch.Tensor:
                return full(w.detach()).float()

        entries.append((hf, tensor.shape, gather))
    return entries


def adapter_bytes(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes of the adapter tensors in `dtype` (global shapes): one LoRA weight update on the wire."""
    return sum(t.shape.numel() * dtype.itemsize for _, t in adapter_weights(model))


def lora_parameters(hidden: int, kv: int, intermediate: int, layers: int, settings: LoraSettings) -> int:
    """Adapter parameters of a Qwen2-like decoder: r x (in + out) for each target linear layer of each layer."""
    shapes = {
        "q_proj": (hidden, hidden),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }
    per_layer = sum(settings.rank * sum(shapes[t]) for t in settings.target_modules if t in shapes)
    return layers * per_layer
