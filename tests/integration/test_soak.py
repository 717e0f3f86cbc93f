"""The soak's short CI variant: `scripts/chaos/soak.py` runs the tiny preset for a few minutes, samples every process of
the run and Redis, stops the run cleanly and judges growth. Asserted: the run stopped cleanly with no process left
behind, samples of every kind of process (the launcher, Redis, the retrieval server, the generator worker, its vLLM
engine, the learner) and of Redis's memory and key count, a growth verdict for each, consistent with the exit code,
and the plot. Whether memory stays flat is for the full hour (docs/reliability.md): minutes after start-up are too
short to judge, so the bound here is loose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"sr1-run", "redis", "retrieval", "generator", "engine-core", "learner"}


def test_a_short_soak_samples_every_process_and_stops_the_run_cleanly(tmp_path):
    out = tmp_path / "soak"
    cmd = [sys.executable, str(ROOT / "scripts" / "chaos" / "soak.py"), "--out", str(out)]
    cmd += ["--duration", "100", "--interval", "4", "--warmup", "55", "--window", "20", "--bound", "0.5"]
    cmd += ["--", "eval.max_prompts=16"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
    output = done.stdout + done.stderr
    assert done.returncode in (0, 1), output  # 2: the run exited early, did not stop cleanly, or left orphans
    assert "[soak] " in done.stdout  # progress lines without a terminal

    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    seen = {p["kind"] for s in samples for p in s["processes"].values()}
    assert seen >= KINDS, f"no samples of {KINDS - seen}; seen {sorted(seen)}"
    assert any(s["redis"] and s["redis"]["version"] > 0 for s in samples), "the learner never published"

    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["run_problems"] == []
    judged = {g["series"].split("[")[0] for g in verdict["growth"]}
    judged_metrics = {g["metric"] for g in verdict["growth"]}
    assert (
        KINDS - {"learner"} <= judged
    )  # the learner starts last: it may miss the first window after warm-up
    assert {"rss_mib", "fds", "threads", "used_memory_mib", "keys"} <= judged_metrics
    assert (done.returncode == 1) == bool(verdict["growth_problems"]), output

    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (out / "samples.csv").read_text().splitlines()
    assert rows[0] == "t_s,process,kind,pid,metric,value" and len(rows) > 100
    keys = json.loads((out / "redis_keys.json").read_text())
    assert any(k["key"] == "sr1:groups" for k in keys)
