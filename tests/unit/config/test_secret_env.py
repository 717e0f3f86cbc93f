"""Config files hold no secrets: `config.yaml` and job files are written masked, and a process gets what its job
file masks through its environment (the variables its launcher sets), or a ConfigError naming the variable."""

from __future__ import annotations

import stat

import pytest

from config import (
    ConfigError,
    GeneratorJob,
    RetrievalJob,
    load_config,
    load_job,
    save_config,
    save_job,
    secret_env,
)

PASSWORD = "pa55-w0rd-for-redis"
TOKEN = "t0k3n-for-retrieval"
OVERRIDES = [f"buffer.redis_url=redis://sr1:{PASSWORD}@10.0.0.5:6379/0", f"retrieval.token={TOKEN}"]


@pytest.fixture
def no_sr1_env(monkeypatch):
    monkeypatch.delenv("SR1_BUFFER__REDIS_URL", raising=False)
    monkeypatch.delenv("SR1_RETRIEVAL__TOKEN", raising=False)


def test_a_job_file_is_masked_and_its_process_gets_the_secrets_from_its_environment(
    tmp_path, monkeypatch, no_sr1_env
):
    job = load_config("tiny", OVERRIDES).generator_job("gen-0", 0)
    path = save_job(job, tmp_path / "jobs" / "gen-0.yaml")
    text = path.read_text()
    assert PASSWORD not in text and TOKEN not in text
    assert "redis://sr1:***@10.0.0.5:6379/0" in text and "token: '***'" in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    env = secret_env(job)
    assert env == {
        "SR1_BUFFER__REDIS_URL": f"redis://sr1:{PASSWORD}@10.0.0.5:6379/0",
        "SR1_RETRIEVAL__TOKEN": TOKEN,
    }
    with pytest.raises(ConfigError, match=r"retrieval\.token \(SR1_RETRIEVAL__TOKEN\).*buffer\.redis_url"):
        load_job(GeneratorJob, path)  # started without its launcher's environment
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded = load_job(GeneratorJob, path)
    assert loaded.buffer.redis_url == job.buffer.redis_url and loaded.retrieval.token == TOKEN
    assert loaded == job


def test_an_override_gives_a_masked_secret_too(tmp_path, no_sr1_env):
    job = load_config("tiny", OVERRIDES).retrieval_job()
    path = save_job(job, tmp_path / "retrieval.yaml")
    assert secret_env(job) == {"SR1_RETRIEVAL__TOKEN": TOKEN}
    assert load_job(RetrievalJob, path, ["retrieval.token=another"]).retrieval.token == "another"


def test_a_job_without_secrets_needs_no_environment(tmp_path, no_sr1_env):
    job = load_config("tiny", ["buffer.redis_url=redis://127.0.0.1:6379/0"]).generator_job("gen-0", 0)
    assert secret_env(job) == {}
    assert load_job(GeneratorJob, save_job(job, tmp_path / "gen-0.yaml")) == job


def test_a_resumed_config_asks_for_its_secrets_again(tmp_path, monkeypatch, no_sr1_env):
    path = save_config(load_config("tiny", OVERRIDES), tmp_path)
    assert PASSWORD not in path.read_text() and TOKEN not in path.read_text()
    with pytest.raises(ConfigError, match=r"SR1_BUFFER__REDIS_URL.*never writes a secret to disk"):
        load_config(path)
    monkeypatch.setenv("SR1_BUFFER__REDIS_URL", f"redis://sr1:{PASSWORD}@10.0.0.5:6379/0")
    cfg = load_config(path, [f"retrieval.token={TOKEN}"])
    assert cfg.buffer.redis_url.endswith(f":{PASSWORD}@10.0.0.5:6379/0") and cfg.retrieval.token == TOKEN
