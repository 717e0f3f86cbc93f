"""A small world for the tests that launch whole runs (`sr1 launch`, pools started one by one): short questions
about made-up companies, a corpus that answers them, and the overrides that point a config at them and at a model.

    overrides = small_world_overrides(tmp_path / "world", tiny_model_dir)      # data, corpus, model, sizes
    subprocess.run([sys.executable, "-m", "sr1", "launch", "tiny", *overrides, ...])

The model is the conftest's tiny random policy (seconds to build, no cache shared with other runs); prompts are a
single short user line, so a group is quick to generate on a loaded CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = ["alpha", "bravo", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper"]


def _facts(count: int) -> list[tuple[str, str]]:
    """(company, founder) pairs, the same as the conftest's tokenizer texts talk about."""
    return [(f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]}", WORDS[(i * 7) % 10]) for i in range(count)]


def write_questions(path: Path, facts: list[tuple[str, str]], offset: int = 0) -> Path:
    with path.open("w") as f:
        for i, (company, founder) in enumerate(facts):
            row = {
                "prompt": f"Question: who founded {company}?\n",
                "golden_answers": [founder],
                "data_source": "nq",
                "id": offset + i,
            }
            f.write(json.dumps(row) + "\n")
    return path


def write_corpus(path: Path, facts: list[tuple[str, str]]) -> Path:
    with path.open("w") as f:
        for i, (company, founder) in enumerate(facts):
            f.write(
                json.dumps({"id": str(i), "contents": f'"{company}"\n{company} was founded by {founder}.'})
                + "\n"
            )
    return path


def small_world_overrides(out: Path, model_dir: Path, *, train: int = 200, test: int = 8) -> list[str]:
    """Write the world's files into `out`; the dotted overrides that run the tiny preset on it, small and quick."""
    out.mkdir(parents=True, exist_ok=True)
    facts = _facts(train + test)
    train_file = write_questions(out / "train.jsonl", facts[:train])
    test_file = write_questions(out / "test.jsonl", facts[train:], offset=train)
    corpus = write_corpus(out / "corpus.jsonl", facts)
    return [
        f"model.path={model_dir}",
        "model.max_prompt_tokens=64",
        f"data.train_files=[{train_file}]",
        f"data.test_files=[{test_file}]",
        f"retrieval.retriever.corpus_path={corpus}",
        "generators.group_size=4",
        "generators.max_tokens_per_turn=24",
        "generators.max_response_tokens=96",
        "generators.max_inflight_groups=8",
        "generators.heartbeat_s=1.0",
        "generators.engine.max_num_seqs=32",
        "generators.engine.cpu_kvcache_gb=0.25",
        "learner.groups_per_step=4",
        "learner.micro_batch_tokens=2048",
        "eval.max_prompts=4",
        "eval.every_steps=0",
    ]
