"""The probe that goes with each publish: proof that an engine samples from the weights (or adapter) it claims.

    probe = ProbeSource(model, head_options)
    probe.take(sequences)          # each step: the batch's first trajectory, its last PROBE_TOKENS tokens
    probe.at(version)              # before a publish, on every rank (an FSDP forward): {"token_ids", "logprobs"}

The learner scores tokens 1..n-1 of a short fixed row given its prefix, at temperature 1 (what vLLM's
`prompt_logprobs` returns), with the same log-prob path as training (`token_logprobs`) and the weights being
published. After loading that version, each engine scores the same row and compares (generators/): an engine still
on the base model or on an older adapter disagrees. The window is the trajectory's *last* tokens, its response and
tool results, where a trained policy differs most from the one it started from. Version 0 (nothing trained) has no
probe; the publishes that repeat a version (a re-formed group) reuse the one computed for it.
"""

from __future__ import annotations

import numpy as np
import torch

from learner.model import reshard
from learner.packing import Sequence, pack, token_logprobs

PROBE_TOKENS = 128


def probe_sequence(token_ids: np.ndarray, length: int = PROBE_TOKENS) -> Sequence | None:
    """The last `length` tokens of a row as a sequence whose every token after the first is scored (None: too
    short to score anything)."""
    window = np.asarray(token_ids, dtype=np.int64)[-length:]
    n = len(window)
    if n < 2:
        return None
    return Sequence(
        token_ids=window,
        prompt_len=1,
        loss_mask=np.ones(n - 1, dtype=np.uint8),
        behavior_logprobs=np.zeros(n - 1, dtype=np.float32),
        versions=np.zeros(n - 1, dtype=np.int32),
        advantage=0.0,
    )


class ProbeSource:
    """Keeps the row to probe with (the last batch's first trajectory) and the probe computed for each version."""

    def __init__(self, model: torch.nn.Module, head_options: dict):
        self.model = model
        self.head_options = head_options
        self.sequence: Sequence | None = None
        self._cached: tuple[int, dict | None] | None = None

    def take(self, sequences: list[Sequence]) -> None:
        """The batch just trained: its first trajectory is probed at the version it produces."""
        if sequences:
            self.sequence = probe_sequence(sequences[0].token_ids)

    def at(self, version: int) -> dict | None:
        """`{"token_ids": [n], "logprobs": [n - 1]}` at the model's current weights, published as `version`; None
        before any step. A collective: every rank calls it at the same point."""
        if self.sequence is None or version == 0:
            return None
        if self._cached is not None and self._cached[0] == version:
            return self._cached[1]
        device = next(self.model.parameters()).device
        mb = pack([self.sequence]).to(device)
        training = self.model.training
        self.model.eval()  # no adapter dropout: the engines sample without it
        try:
            with torch.no_grad():
                logprobs, _ = token_logprobs(self.model, mb, 1.0, with_entropy=False, **self.head_options)
        finally:
            self.model.train(training)
            reshard(self.model)  # the publish's gathers read the sharded parameters
        probe = {
            "token_ids": [int(t) for t in self.sequence.token_ids],
            "logprobs": [float(x) for x in logprobs.float().cpu()],
        }
        self._cached = (version, probe)
        return probe
