"""What the tiny world promises on every machine, and nothing more.

Identical everywhere (checked by checksum): the default world's corpus, questions and tokenizer. They come from
seeded Python `random` and a single-threaded BPE trainer, with no floating point in between. (The tokenizer is
trained on the warm-start trajectories' text too: `WORLD_VERSION` 5's 1,000 trajectories gave another checksum; 6 is
back to 4's 2,000 and to its checksum.)

Not identical everywhere: the warm-started weights. Training sums floating-point numbers, and a sum in another order
differs in its last bits, which 2,500 optimizer steps then amplify. The build pins its math libraries to one code path
and two threads (`world.PINNED_ENV`), but MKL's documentation says a fixed branch holds on Intel CPUs only (on
others it takes its automatic branch), and an AMD EPYC machine gave other weight bytes than the Intel Xeon these
figures come from. What the test promises instead is the warm-started policy's *behaviour* (`world.probe`: the
real agent loop, greedy, transformers engine, the world's BM25), within bounds set from how far other reduction
orders moved it. Measured on 2026-11-24 on an "Intel(R) Xeon(R) Processor" (2 cores, AVX-512, torch 2.13.0) by
building seed 0's world several ways: pinned as shipped, and pinned with one thread (the same bytes); unpinned on the
AVX-512 paths (other bytes). Every build gave the same greedy figures: test EM 0.36, the full-name query written on
0.09 of the questions and the first-name one on 0.90, EM 0.99 with the full-name query forced and 0.30 with the
first-name one, every trajectory searching and then answering; greedy answers agreed with the shipped build's on 90
of 100 questions. The bounds below are far wider than any difference seen (an AMD EPYC machine's `make run` started
at EM 0.33 with vLLM's greedy sampler, against 0.34 here; five other seeds' worlds start at 0.29-0.38), and narrower
than what would break the tiny run:
a policy that cannot copy an answer, skips the protocol, or already searches well leaves RL nothing to show.

The recipe of 2026-11-28 (`WORLD_VERSION` 5: 1,000 trajectories instead of 2,000, 1,260 steps instead of 2,500, the
lean forward on one thread) gave, on the same kind of machine: EM 0.33, the full-name query on 0.06 and the
first-name one on 0.91, 0.99 and 0.30 with them forced, every trajectory searching then answering, the full-name
query sampled on 0.09 (`python scripts/tiny_world.py --out DIR --check`); every bound below held. But `sr1 run` on it
went from EM 0.33 to 0.37 only, so `WORLD_VERSION` 6 went back to 4's recipe (docs/tiny-world.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEED = 0  # the world `sr1 run` trains on by default (shipped in world/shipped/seed0, installed into runs/.world-cache)
EXPECTED_DATA = {
    "corpus": "036d6c661b760a2b52858374d9ad0dd991993e2ac4ef40cbb677c8030313c390",
    "questions": "4ce59ed9a2c174212af6d83294b5710231bed4dcd07baef2bca15c07bf859c8a",
    "tokenizer": "0ee84c1929606d70997fdd786dda9308ca3166bce139d08cf5efc6f837d92fa1",
}
# (low, high) for each figure of the greedy and forced probes over the 100 test questions
BEHAVIOUR = {  # "measured": WORLD_VERSION 4 (2026-11-24), then 5 (2026-11-28), Intel Xeon
    "greedy/em": (0.22, 0.50),  # measured 0.36, 0.33: low enough for RL to raise
    "greedy/searched_and_answered": (0.95, 1.0),  # speaks the protocol
    "greedy/imperfect_query": (0.70, 1.0),  # measured 0.90, 0.91: prefers the first-name query, what RL fixes
    "greedy/good_query": (0.0, 0.25),  # measured 0.09, 0.06
    "forced_good/em": (0.90, 1.0),  # measured 0.99, 0.99: copies the answer from the right passage
    "forced_imperfect/em": (0.15, 0.45),  # measured 0.30, 0.30: a namesake's passage often comes first
    # room for RL: at temperature 1 the policy must write the full-name query now and then, or RL has nothing to
    # reinforce (measured 0.18 on an AMD EPYC, then 0.09; a 6-epoch warm start gave 0.00 and its run went from EM
    # 0.30 to 0.28, while every bound above held)
    "sampled/good_query": (0.05, 0.40),
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def data_checksums(world) -> dict[str, str]:
    """Checksums of content, not files (a newer pyarrow or tokenizers writing the same data differently is fine)."""
    import pyarrow.parquet as pq

    rows = [pq.read_table(p).to_pylist() for p in (world.train_path, world.test_path)]
    tokenizer = json.loads((world.model_dir / "tokenizer.json").read_text())
    vocab = {"model": tokenizer["model"], "added": tokenizer["added_tokens"]}
    return {
        "corpus": _sha(world.corpus_path.read_bytes()),
        "questions": _sha(json.dumps(rows, sort_keys=True).encode()),
        "tokenizer": _sha(json.dumps(vocab, sort_keys=True).encode()),
    }


def _outside(figures: dict[str, float]) -> dict[str, tuple]:
    return {
        key: (round(figures[key], 3), bounds)
        for key, bounds in BEHAVIOUR.items()
        if not bounds[0] <= figures[key] <= bounds[1]
    }


@pytest.fixture(scope="module")
def default_world():
    from sr1.embedded import RUNS_ROOT
    from world import build_world

    return build_world(RUNS_ROOT / ".world-cache" / f"seed{SEED}", seed=SEED, progress=False)


def test_the_default_world_data_is_identical_on_every_machine(default_world):
    assert data_checksums(default_world) == EXPECTED_DATA


def test_the_warm_started_policy_behaves_the_same_on_every_machine(default_world):
    from world import WorldSizes
    from world.kb import build_kb
    from world.probe import probe_policy

    kb = build_kb(SEED, WorldSizes())
    figures = asyncio.run(
        probe_policy(
            default_world, kb, kb.test, modes=("greedy", "forced_good", "forced_imperfect", "sampled")
        )
    )
    outside = _outside(figures)
    assert not outside, (
        f"the warm-started policy left its bounds (figure, (low, high)): {outside}; all: {figures}"
    )


@pytest.mark.long
@pytest.mark.timeout(2400)
def test_a_rebuild_here_is_equivalent_to_the_shipped_world(default_world, tmp_path):
    """The shipped default world (world/shipped/seed0, what every first run installs) is what this machine builds
    from the recipe: the same corpus, questions and tokenizer, and a warm-started policy within the same bounds."""
    from world import SHIPPED_DIR, WorldSizes, build_world
    from world.kb import build_kb
    from world.probe import probe_policy

    rebuilt = build_world(tmp_path / "seed0", seed=SEED, progress=False, shipped=False)
    # the shipped copy is found as it is (its marker matches), never built
    shipped = build_world(SHIPPED_DIR / f"seed{SEED}", seed=SEED, progress=False)
    assert data_checksums(rebuilt) == data_checksums(shipped) == EXPECTED_DATA
    kb = build_kb(SEED, WorldSizes())
    figures = asyncio.run(
        probe_policy(rebuilt, kb, kb.test, modes=("greedy", "forced_good", "forced_imperfect", "sampled"))
    )
    outside = _outside(figures)
    assert not outside, f"the rebuilt policy left the bounds (figure, (low, high)): {outside}; all: {figures}"


def test_another_seed_started_from_the_shipped_policy_behaves_like_the_shipped_world(tmp_path):
    """A new seed's world starts its warm start from the shipped policy, renamed to its words (`world.transfer`),
    for two epochs: its policy must show the same behaviour before RL, within the same bounds. Measured for seed
    101 on 2026-11-28 (Intel Xeon, `python scripts/bench/bench_warmstart_transfer.py --seed 101 --epochs 2`): EM
    0.25, the first-name query on 0.91 and the full-name one on 0.09, EM 0.99 with the full-name query forced, the
    full-name query sampled on 0.30 (the bench samples with the seed's torch seed, this test with 0)."""
    from world import MARKER_FILE, WorldSizes, build_world
    from world.kb import build_kb
    from world.probe import probe_policy
    from world.transfer import TRANSFER_EPOCHS

    seed = 101
    world = build_world(tmp_path / f"seed{seed}", seed=seed, progress=False)
    marker = json.loads((tmp_path / f"seed{seed}" / MARKER_FILE).read_text())
    assert marker["warm_start_from"] == {"seed": 0, "version": marker["version"], "epochs": TRANSFER_EPOCHS}
    kb = build_kb(seed, WorldSizes())
    figures = asyncio.run(
        probe_policy(world, kb, kb.test, modes=("greedy", "forced_good", "forced_imperfect", "sampled"))
    )
    outside = _outside(figures)
    assert not outside, (
        f"seed {seed}'s policy left the bounds (figure, (low, high)): {outside}; all: {figures}"
    )


def test_the_probe_tells_a_policy_that_cannot_search_from_the_warm_started_one(default_world, tmp_path):
    """The bounds can fail: the same world with an untrained model of the same shape is far outside them."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    from world import TinyWorld, WorldSizes
    from world.kb import build_kb
    from world.probe import probe_policy

    model_dir = tmp_path / "model"
    shutil.copytree(default_world.model_dir, model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)  # random weights, same tokenizer
    world = TinyWorld(default_world.corpus_path, default_world.train_path, default_world.test_path, model_dir)
    kb = build_kb(SEED, WorldSizes())
    figures = asyncio.run(probe_policy(world, kb, kb.test[:10], modes=("greedy",)))
    low, _ = BEHAVIOUR["greedy/searched_and_answered"]
    assert figures["greedy/searched_and_answered"] < low
