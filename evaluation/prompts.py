"""Which test prompts an evaluation measures (`select_prompts`), and which of them one worker answers (`shard`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from buffer.records import PromptRecord


def select_prompts(
    prompts: Sequence[PromptRecord],
    *,
    max_prompts: int | None = None,
    max_per_source: int | None = None,
    seed: int = 0,
) -> list[PromptRecord]:
    """The evaluation set: every prompt, or a sample stratified over data sources.

    `max_per_source` keeps at most that many prompts of each source. `max_prompts` caps the total, shared equally
    between sources (a source with fewer prompts gives its unused share to the others), so a test file that lists
    NQ first is not measured on NQ alone. Which prompts of a source are kept is a seeded random choice (the same on
    every machine); the result keeps the file order.
    """
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, prompt in enumerate(prompts):
        by_source[prompt.data_source].append(i)
    quota = {
        s: len(ix) if max_per_source is None else min(len(ix), max_per_source) for s, ix in by_source.items()
    }
    if max_prompts is not None and sum(quota.values()) > max_prompts:
        quota = _share_equally(quota, max_prompts)
    rng = np.random.Generator(np.random.PCG64(seed))
    kept: list[int] = []
    for source in sorted(
        by_source
    ):  # sorted: the draw does not depend on which source comes first in the file
        indices = by_source[source]
        chosen = (
            indices if quota[source] == len(indices) else rng.choice(indices, quota[source], replace=False)
        )
        kept.extend(int(i) for i in chosen)
    return [prompts[i] for i in sorted(kept)]


def _share_equally(available: dict[str, int], total: int) -> dict[str, int]:
    """Water-filling: each source gets total / sources, capped at what it has; leftovers go to the others."""
    share = dict.fromkeys(available, 0)
    left = total
    open_sources = sorted(available)
    while left > 0 and open_sources:
        each, extra = divmod(left, len(open_sources))
        for k, source in enumerate(open_sources):
            give = min(each + (1 if k < extra else 0), available[source] - share[source])
            share[source] += give
            left -= give
        open_sources = [s for s in open_sources if share[s] < available[s]]
    return share


def shard(prompts: Sequence[PromptRecord], index: int, count: int) -> list[PromptRecord]:
    """The prompts worker `index` of `count` answers."""
    if not 0 <= index < count:
        raise ValueError(f"shard {index} of {count} does not exist")
    return list(prompts[index::count])
