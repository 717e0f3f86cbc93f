"""The pool launchers: GPU slicing, one job file per process with only its sections, the CLI's argument checks."""

from __future__ import annotations

import pytest

from config import EXIT_BAD_INPUT, GeneratorJob, LearnerJob, load_config, load_job
from sr1.launch.pools import generator_children, generators_main, gpu_slices, learner_children, learner_main


def test_gpu_slices_split_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert gpu_slices(2, 2) == ["0,1", "2,3"]
    assert gpu_slices(4, 1) == ["0", "1", "2", "3"]
    with pytest.raises(SystemExit, match="need 6 GPUs; 4 visible"):
        gpu_slices(3, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_slices(2, 1) == [None, None]


@pytest.mark.parametrize("main", [generators_main, learner_main])
def test_cli_needs_a_redis_url(main, capsys):
    assert main(["--config", "tiny"]) == EXIT_BAD_INPUT
    assert "--redis-url" in capsys.readouterr().err


def test_each_generator_gets_its_own_job_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = load_config(
        "tiny", [f"run_dir={tmp_path}", "buffer.redis_url=redis://x:1/0", "generators.group_size=2"]
    )
    children = generator_children(cfg, 2, "gen-")
    assert [c.name for c in children] == ["gen-0", "gen-1"]
    for i, child in enumerate(children):
        assert child.cmd[1:3] == ["-m", "sr1.entrypoints.generators"] and child.cmd[3] == "--config"
        job = load_job(GeneratorJob, child.cmd[4])
        assert (job.worker_id, job.engine_index) == (f"gen-{i}", i)
        assert job.generators.group_size == 2 and job.buffer.redis_url == "redis://x:1/0"
        assert job == cfg.generator_job(f"gen-{i}", i)
        assert not hasattr(job, "learner") and not hasattr(job, "weight_sync")  # only what a generator uses


def test_learner_ranks_share_one_job_file_and_a_torchrun_environment(tmp_path):
    cfg = load_config(
        "tiny",
        [
            f"run_dir={tmp_path}",
            "buffer.redis_url=redis://x:1/0",
            "learner.num_ranks=2",
            "generators.temperature=0.7",
        ],
    )
    ranks = learner_children(cfg, resume=True)
    assert [r.name for r in ranks] == ["learner-0", "learner-1"]
    assert ranks[0].cmd[-1] == "--resume" and ranks[0].cmd[4] == ranks[1].cmd[4]
    assert [r.env["RANK"] for r in ranks] == ["0", "1"] and {r.env["WORLD_SIZE"] for r in ranks} == {"2"}
    assert ranks[0].env["MASTER_PORT"] == ranks[1].env["MASTER_PORT"]
    job = load_job(LearnerJob, ranks[0].cmd[4])
    assert job.temperature == 0.7 and job.num_engines == cfg.generators.num_engines
    assert not hasattr(job, "generators") and not hasattr(job, "retrieval")
