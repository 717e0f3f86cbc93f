"""The Search-R1 workflow on the Qwen2.5-shaped preset, as a user runs it: FlashRAG-shaped files -> `sr1 data prepare`
-> a few `sr1 run` steps through the real engine, buffer, learner and weight sync (Qwen's tokenizer, its 151,936-row
embedding, ChatML, EOS <|im_end|>) -> `sr1 eval` of the checkpoint, per data source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def _sr1(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "sr1", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, f"sr1 {args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_prepare_run_and_evaluate_on_qwen_shapes(tmp_path):
    from world.flashrag import write_rehearsal

    write_rehearsal(tmp_path, seed=3)
    _sr1("data", "prepare", "--flashrag", str(tmp_path / "flashrag"), "--out", str(tmp_path / "data"))
    run_dir = tmp_path / "run"
    _sr1(
        "run",
        "qwen2.5-cpu",
        f"data.train_files=[{tmp_path / 'data' / 'train.parquet'}]",
        f"data.test_files=[{tmp_path / 'data' / 'test.parquet'}]",
        f"retrieval.retriever.corpus_path={tmp_path / 'corpus.jsonl'}",
        f"learner.total_steps={STEPS}",
        "learner.checkpoint_every=1",
        "eval.max_per_source=2",
        "--run-dir",
        str(run_dir),
        "--no-live",
    )
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == STEPS
    config = json.loads((Path(report["checkpoint"]) / "config.json").read_text())
    assert config["vocab_size"] == 151_936 and config["tie_word_embeddings"] is True
    # the trajectories the learner trained on were tokenized by Qwen's tokenizer, under ChatML
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(report["checkpoint"])
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template

    out = tmp_path / "eval"
    _sr1("eval", "--run-dir", str(run_dir), "--max-per-source", "2", "--out", str(out), timeout=900)
    result = json.loads((out / "eval.json").read_text())
    sources = [r["source"] for r in result["per_source"]]
    assert sources == [
        "2wikimultihopqa",
        "bamboogle",
        "hotpotqa",
        "musique",
        "nq",
        "popqa",
        "triviaqa",
        "all",
    ]
    assert result["summary"]["eval/n"] == 14 and result["header"]["version"] == STEPS
    prompt = result["items"][0]
    assert prompt["finish_reason"] in ("answer", "eos", "max_turns", "budget")
