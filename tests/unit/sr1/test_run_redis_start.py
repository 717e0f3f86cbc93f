"""`sr1 run` rides out its Redis dying in the first second, before anything else started: the supervisor restarts it
on its port and AOF while `prepare` waits, as it does later in the run (the whole run is tried by
tests/integration/test_chaos_network.py and `scripts/chaos/chaos.py`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from config import load_config
from sr1.run import Orchestrator


def _prompts(path, n=4):
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": f"question {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": {"target": ["cedar"]}},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


class RedisDiesAtOnce(Orchestrator):
    """Kills its Redis the moment it answered, before the buffer is opened."""

    killed = 0

    def _start_redis(self, cfg):
        cfg = super()._start_redis(cfg)
        self.redis_server.kill()
        RedisDiesAtOnce.killed += 1
        return cfg


@pytest.mark.timeout(120)
def test_a_redis_killed_before_the_buffer_opens_is_restarted_and_the_run_goes_on(tiny_model_dir, tmp_path):
    train = _prompts(tmp_path / "train.parquet")
    cfg = load_config("tiny", [f"model.path={tiny_model_dir}", f"data.train_files=[{train}]"])
    orchestrator = RedisDiesAtOnce(cfg, tmp_path / "run", resume=False, live=False, startup_timeout_s=60)
    try:
        orchestrator.prepare()
        assert RedisDiesAtOnce.killed == 1
        assert orchestrator.redis_server.alive  # restarted by the supervisor while prepare waited
        orchestrator.buffer.publish_version(1)
        assert orchestrator.buffer.version() == 1
    finally:
        orchestrator.stop(interrupted=False)
