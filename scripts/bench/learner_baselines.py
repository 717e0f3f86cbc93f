"""The yardsticks of scripts/bench/bench_learner.py: Qwen2.5 model shapes built from a config, the padded step and a plain
PyTorch step.

    model_dir = write_shape_model("qwen2.5-1.5b", out_dir)     # random init, real vocabulary, no download
    padded_step(learner, groups, budget=16384)                 # the learner's model, optimizer and loss, padded
    plain = PlainStep(model_dir, torch.device("cuda"), checkpointing="full", kl_coef=0.001)
    seconds, tokens = plain.step(rows=8, row_len=2048, micro_batches=2)
    model_dir = shape_model_dir("qwen2.5-3b", cache_dir)         # written once, reused by later runs

The padded step is the usual padded data loader on the learner's own model, optimizer, clipping and loss: sequences in
arrival order, each micro-batch padded to its longest sequence (rows x longest <= budget), a 2-D padding mask.

The plain step is what a careful single-GPU PyTorch loop reaches with stock kernels, the bar the learner's MFU is
held to: no FSDP, fp32 master weights, autocast to bf16, SDPA causal attention on dense rows (every row one
sequence, no packing, no padding), the LM head in bf16 through the same chunked log-prob head the learner uses
(an fp32 head would run its matmul in fp32), mean next-token log-likelihood as the loss, foreach gradient clipping,
fused AdamW; checkpointing as the learner's (none, full, or every N-th layer). Where the learner forwards a frozen
reference for its KL loss, the plain step does too: a copy of the model in the compute dtype forwards every
micro-batch of the update before the first backward, and a k3 KL to it joins the loss. Throughput and memory do not
depend on the weights' values, so random weights measure the real thing.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

QWEN_VOCAB = 151_936
# Qwen2.5's published configs (all three tie the LM head to the embeddings)
SHAPES = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
    },
    "qwen2.5-3b": {
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
    },
}
# gradient checkpointing from 1.5B on, as the GPU presets run them (0.5B fits a 16k micro-batch without it)
CHECKPOINTED_SHAPES = {"qwen2.5-1.5b", "qwen2.5-3b"}
# the learner's checkpointing policies the plain step reproduces (HF's per-layer checkpointing)
PLAIN_CHECKPOINTING = ("none", "full", "every_n")


def shape_config(shape: str):
    """The transformers config of a Qwen2.5 shape (Qwen2.5's vocabulary, RoPE and norm settings, tied head)."""
    from transformers import Qwen2Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return Qwen2Config(
        vocab_size=QWEN_VOCAB,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        **SHAPES[shape],
    )


def write_shape_model(shape: str, out_dir: Path, device: str = "cpu") -> Path:
    """A random-init Qwen2 checkpoint of the named shape (bf16 safetensors; the learner loads it as fp32)."""
    from transformers import Qwen2ForCausalLM

    config = shape_config(shape)
    torch.manual_seed(0)
    with torch.device(device):  # initialising on the GPU takes seconds where the CPU takes minutes at 3B
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    del model
    return out_dir


def shape_model_dir(shape: str, cache_dir: Path, device: str = "cpu") -> Path:
    """`cache_dir/shape`, written by `write_shape_model` unless an earlier run wrote it (into a temporary directory
    renamed when complete, so a run killed while writing leaves nothing half-written behind)."""
    import shutil
    import tempfile

    out = Path(cache_dir) / shape
    if not out.is_dir():
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{shape}-", dir=cache_dir))
        try:
            write_shape_model(shape, partial, device=device)
            partial.rename(out)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return out


def padded_micro_batches(sequences, budget: int):
    """Arrival order, rows x longest <= budget (the usual padded data loader)."""
    batches, current = [], []
    for s in sequences:
        longest = max([len(x) for x in current] + [len(s)])
        if current and (len(current) + 1) * longest > budget:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def _padded_loss(learner, seqs, device):
    """The trainer's loss over one padded micro-batch: the same targets, chunked head and algorithm as the packed
    path, the hidden states taken at every row's target positions."""
    from learner.execution.chunked_logprobs import chunked_logprobs
    from learner.packing import final_hidden_states, lm_head_weight

    longest = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest, dtype=torch.long)
    target = torch.zeros(n, longest, dtype=torch.long)
    has_target = torch.zeros(n, longest, dtype=torch.bool)
    loss_mask = torch.zeros(n, longest)
    behavior = torch.zeros(n, longest)
    adv = torch.zeros(n, longest)
    for i, s in enumerate(seqs):
        L, p = len(s), s.prompt_len
        ids[i, :L] = torch.from_numpy(s.token_ids)
        mask[i, :L] = 1
        target[i, p - 1 : L - 1] = torch.from_numpy(s.token_ids[p:])
        has_target[i, p - 1 : L - 1] = True
        loss_mask[i, p - 1 : L - 1] = torch.from_numpy(s.loss_mask.astype("float32"))
        behavior[i, p - 1 : L - 1] = torch.from_numpy(s.behavior_logprobs)
        adv[i, p - 1 : L - 1] = s.advantage
    model = learner.model
    hidden = final_hidden_states(model, input_ids=ids.to(device), attention_mask=mask.to(device))
    sel = has_target.to(device)
    logprobs, entropy = chunked_logprobs(
        hidden[sel],
        lm_head_weight(model),
        target.to(device)[sel],
        temperature=learner.temperature,
        chunk_tokens=learner.cfg.logprob_chunk_tokens,
        with_entropy=True,
    )
    lm = loss_mask.to(device)[sel]
    per_token, _ = learner.algorithm.loss(
        logprobs,
        behavior.to(device)[sel],
        adv.to(device)[sel],
        lm,
        torch.zeros_like(lm),
        entropy=entropy.detach(),
    )
    return per_token.sum()


def padded_step(learner, groups, budget: int) -> None:
    """The learner's model, optimizer, clipping and loss over padded micro-batches; gradient sync on the last."""
    from learner.model import clip_and_step
    from learner.packing import sequences_from_groups

    seqs = sequences_from_groups(groups, learner.algorithm.advantages(groups).advantages)
    total = max(sum(int(s.loss_mask.sum()) for s in seqs), 1)
    micro = padded_micro_batches(seqs, budget)
    for i, batch in enumerate(micro):
        learner.model.set_requires_gradient_sync(i == len(micro) - 1)
        (_padded_loss(learner, batch, learner.world.device) / total).backward()
    clip_and_step(learner.model, learner.optimizer, learner.cfg.grad_clip)


class PlainStep:
    """One training step of a plain (unsharded) PyTorch model; see the module docstring."""

    def __init__(
        self,
        model_dir: str | Path,
        device: torch.device,
        *,
        checkpointing: str = "none",
        checkpointing_every: int = 1,
        bf16: bool = True,
        chunk_tokens: int = 1024,
        kl_coef: float = 0.0,
        policy_forward: bool = False,
    ):
        """`checkpointing`: none, full, or every_n (every `checkpointing_every`-th decoder layer recomputed).
        `kl_coef` > 0: a frozen reference (in the compute dtype) forwards every micro-batch before the update and
        its k3 KL to the policy joins the loss, as the learner's reference forward and KL loss do.
        `policy_forward`: the policy also forwards every micro-batch without gradient before the update, as the
        learner's proximal pass does (a step of several updates with a `recompute` correction)."""
        from transformers import AutoModelForCausalLM

        if checkpointing not in PLAIN_CHECKPOINTING:
            raise ValueError(
                f"the plain step checkpoints {', '.join(PLAIN_CHECKPOINTING)}, not {checkpointing!r} "
                "(run the benchmark with --no-plain)"
            )
        self.device, self.bf16, self.chunk_tokens, self.kl_coef = device, bf16, chunk_tokens, kl_coef
        self.policy_forward = policy_forward
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="sdpa"
        ).to(device)
        self.model.config.use_cache = False
        if checkpointing != "none":
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            every = checkpointing_every if checkpointing == "every_n" else 1
            for i, layer in enumerate(self.model.model.layers):
                layer.gradient_checkpointing = i % every == 0
        self.model.train()  # transformers loads in eval mode, where checkpointing is silently off
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-5, fused=True)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.vocab = self.model.config.vocab_size
        self.reference = None
        if kl_coef > 0:
            self.reference = AutoModelForCausalLM.from_pretrained(
                str(model_dir), dtype=self._compute_dtype, attn_implementation="sdpa"
            ).to(device)
            self.reference.config.use_cache = False
            self.reference.eval().requires_grad_(False)

    @property
    def _compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    def _logprobs(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token log-probs of every position but the last, through the learner's chunked head."""
        from learner.execution.chunked_logprobs import chunked_logprobs
        from learner.packing import final_hidden_states

        compute = self._compute_dtype
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            hidden = final_hidden_states(model, input_ids=input_ids)  # no mask: SDPA's is_causal
        hidden = hidden[:, :-1].reshape(-1, hidden.shape[-1]).to(compute)
        weight = model.get_output_embeddings().weight.to(compute)
        logprobs, _ = chunked_logprobs(
            hidden,
            weight,
            input_ids[:, 1:].reshape(-1),
            temperature=1.0,
            chunk_tokens=self.chunk_tokens,
            with_entropy=False,
        )
        return logprobs

    def _loss(self, input_ids: torch.Tensor, ref_logprobs: torch.Tensor | None) -> torch.Tensor:
        logprobs = self._logprobs(self.model, input_ids)
        loss = -logprobs.mean()
        if ref_logprobs is not None:  # k3 (low-variance) KL estimate to the reference
            delta = ref_logprobs - logprobs
            loss = loss + self.kl_coef * (delta.exp() - delta - 1).mean()
        return loss

    def step(self, rows: int, row_len: int, micro_batches: int = 1, seed: int = 0) -> tuple[float, int]:
        """`micro_batches` accumulated micro-batches of `rows` x `row_len` random tokens (the no-gradient forwards of
        each first: the reference's, the policy's), then clip and AdamW; returns (seconds, tokens)."""
        generator = torch.Generator().manual_seed(seed)
        batches = [
            torch.randint(0, self.vocab, (rows, row_len), generator=generator).to(self.device)
            for _ in range(micro_batches)
        ]
        self._synchronize()
        start = time.perf_counter()
        refs: list[torch.Tensor | None] = [None] * micro_batches
        with torch.no_grad():
            if self.reference is not None:
                refs = [self._logprobs(self.reference, input_ids) for input_ids in batches]
            if (
                self.policy_forward
            ):  # the proximal log-probs (kept, as the learner keeps them, though unused here)
                proximal = [self._logprobs(self.model, input_ids) for input_ids in batches]
                del proximal
        for input_ids, ref in zip(batches, refs, strict=True):
            (self._loss(input_ids, ref) / micro_batches).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._synchronize()
        return time.perf_counter() - start, rows * row_len * micro_batches

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Free the models and optimizer state (the learner is measured after this, on the same GPU)."""
        del self.model, self.optimizer, self.reference
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
