"""`sr1 buffer --run-dir` on a run's own Redis, whose user may read the run's namespace only: the namespace comes from
the run's config.yaml, and another one is a clear error, not a traceback."""

from __future__ import annotations

import json

from buffer.cli import main
from buffer.redis_buffer import ReplayBuffer
from config import load_config, save_config
from sr1.launch.redis_server import run_redis


def test_sr1_buffer_reads_the_run_dirs_namespace(tmp_path, capsys):
    cfg = load_config("tiny", ["buffer.namespace=team-a"])
    save_config(cfg, tmp_path)
    server = run_redis(tmp_path, cfg.buffer).start()
    try:
        ReplayBuffer(server.url, "team-a").publish_version(2)
        assert main(["stats", "--json", "--run-dir", str(tmp_path)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["namespace"] == "team-a" and out["stats"]["buffer/version"] == 2
        assert ":***@" in out["url"]  # the password is never shown
        assert main(["stats", "--json", "--run-dir", str(tmp_path), "--namespace", "sr1"]) == 2
        err = capsys.readouterr().err
        assert "may not read namespace 'sr1'" in err and server.password not in err
    finally:
        server.stop()
