"""Keys of earlier versions still load, with a warning naming the new key; a moved knob that the chosen member of its
union lacks (ignored then) is dropped."""

from __future__ import annotations

import logging

import pytest
import yaml

from config import load_config, load_job
from config.loader import PRESETS_DIR, _check_key_path
from config.migrate import RENAMED, migrate
from retrieval.job import RetrievalJob

# the retrieval section as an earlier version saved it in every run directory's config.yaml (every key present)
OLD_RETRIEVAL = """
retrieval:
  method: dense
  corpus_path: /data/wiki-18.jsonl
  index_path: /data/e5_Flat.index
  encoder: {model: /models/e5-base-v2, max_length: 256}
  faiss_index: Flat
  flat_search: auto
  torch_threads: 1
  faiss_gpu: false
  hnsw_ef_search: 64
  ivf_nprobe: 16
  bm25_k1: 1.2
  bm25_b: 0.75
  bm25_threads: 0
  reranker: {enabled: false}
  online: {base_url: null, api_key_env: null, google_cx_env: GOOGLE_CSE_ID, timeout_s: 10.0, concurrency: 16,
           snippet_only: true}
  host: 0.0.0.0
  port: 8123
  topk: 5
  max_topk: 50
  workers: 2
  cache_size: 0
  token: tok
  url: http://10.0.0.7:8123/retrieve
  timeout_s: 2.5
  max_retries: 1
  backoff_s: 0.1
"""


def test_every_renamed_key_names_a_key_that_exists():
    for old, new in RENAMED.items():
        _check_key_path(new.split("."), f"RENAMED[{old!r}]")


def test_an_old_retrieval_section_loads_into_the_new_sections(tmp_path, caplog):
    preset = yaml.safe_load((PRESETS_DIR / "tiny.yaml").read_text()) | yaml.safe_load(OLD_RETRIEVAL)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(preset))
    with caplog.at_level(logging.WARNING, logger="config"):
        cfg = load_config(path).retrieval
    dense = cfg.retriever
    assert (dense.method, str(dense.corpus_path), str(dense.index_path)) == (
        "dense",
        "/data/wiki-18.jsonl",
        "/data/e5_Flat.index",
    )
    assert (dense.encoder.model, dense.faiss_gpu, dense.hnsw_ef_search, dense.ivf_nprobe) == (
        "/models/e5-base-v2",
        False,
        64,
        16,
    )
    server = cfg.server
    assert (
        server.host,
        server.port,
        server.max_topk,
        server.workers,
        server.cache_size,
        server.torch_threads,
    ) == (
        "0.0.0.0",
        8123,
        50,
        2,
        0,
        1,
    )
    assert (cfg.client.url, cfg.client.timeout_s, cfg.client.max_retries, cfg.client.backoff_s) == (
        "http://10.0.0.7:8123/retrieve",
        2.5,
        1,
        0.1,
    )
    assert (cfg.topk, cfg.token) == (5, "tok")
    log = caplog.text
    assert "'retrieval.index_path' is deprecated; use 'retrieval.retriever.index_path'" in log
    assert "'retrieval.bm25_k1' is deprecated; use 'retrieval.retriever.k1'" in log
    assert "'retrieval.port' is deprecated; use 'retrieval.server.port'" in log
    assert "'retrieval.url' is deprecated; use 'retrieval.client.url'" in log
    assert "dropping 'retrieval.retriever.k1': retrieval.retriever 'dense' has no such setting" in log
    assert "'retrieval.online.snippet_only' is gone" in log


def test_a_saved_old_bm25_config_keeps_its_bm25_knobs():
    values = yaml.safe_load(OLD_RETRIEVAL.replace("method: dense", "method: bm25"))
    retriever = migrate(values, "old.yaml")["retrieval"]["retriever"]
    assert retriever == {
        "method": "bm25",
        "corpus_path": "/data/wiki-18.jsonl",
        "index_path": "/data/e5_Flat.index",
        "k1": 1.2,
        "b": 0.75,
        "threads": 0,
    }


def test_an_online_section_becomes_the_engines_settings():
    old = {"retrieval": {"method": "google", "online": {"base_url": "http://fake", "google_cx_env": "MY_CX"}}}
    assert migrate(old, "old.yaml")["retrieval"] == {
        "retriever": {"method": "google", "base_url": "http://fake", "cx_env": "MY_CX"}
    }


@pytest.mark.parametrize(
    ("override", "where", "value"),
    [
        ("retrieval.index_path=/idx", ("retriever", "index_path"), "/idx"),
        ("retrieval.bm25_k1=1.1", ("retriever", "k1"), 1.1),
        ("retrieval.workers=3", ("server", "workers"), 3),
        ("retrieval.max_retries=0", ("client", "max_retries"), 0),
    ],
)
def test_old_override_keys_still_apply(override, where, value, caplog):
    with caplog.at_level(logging.WARNING, logger="config"):
        cfg = load_config("tiny", [override]).retrieval
    section, key = where
    assert str(getattr(getattr(cfg, section), key)) == str(value)
    assert f"use 'retrieval.{section}.{key}'" in caplog.text


def test_old_nested_override_keys_follow_their_section():
    cfg = load_config(
        "tiny",
        ["retrieval.method=dense", "retrieval.encoder.model=/m", "retrieval.online.snippet_only=true"],
    )
    assert (cfg.retrieval.retriever.method, cfg.retrieval.retriever.encoder.model) == ("dense", "/m")
    google = load_config("tiny", ["retrieval.method=google", "retrieval.online.google_cx_env=CX"]).retrieval
    assert google.retriever.cx_env == "CX"


def test_an_old_job_file_loads(tmp_path):
    job = tmp_path / "retrieval.yaml"
    job.write_text("job: retrieval\nretrieval:\n  method: bm25\n  corpus_path: c.jsonl\n  port: 9001\n")
    cfg = load_job(RetrievalJob, job, ["retrieval.url=http://h:1/retrieve"]).retrieval
    assert (cfg.retriever.method, str(cfg.retriever.corpus_path), cfg.server.port) == (
        "bm25",
        "c.jsonl",
        9001,
    )
    assert cfg.client.url == "http://h:1/retrieve"


def test_a_correction_knob_of_another_correction_is_still_dropped():
    old = {"learner": {"correction": "icepop", "tis_cap": 2.0, "icepop_low": 0.4}}
    assert migrate(old, "old.yaml")["learner"] == {"correction": {"type": "icepop", "low": 0.4}}


OLD_AUTO = {"floor": 1, "ceiling": 16, "initial": None, "target_kl": 0.05, "min_ess": None, "patience": 2}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # an earlier version's saved config held the auto section beside every bound: used only with `auto`
        ({"max_staleness": "auto", "staleness_auto": OLD_AUTO}, {"max_staleness": {"auto": OLD_AUTO}}),
        ({"max_staleness": 16, "staleness_auto": OLD_AUTO}, {"max_staleness": 16}),
        ({"staleness_auto": OLD_AUTO}, {}),  # the default bound (2) is fixed too
    ],
)
def test_the_old_auto_section_moves_into_the_one_staleness_key(old, new, caplog):
    with caplog.at_level(logging.WARNING, logger="config"):
        assert migrate({"learner": old}, "old.yaml")["learner"] == new
    moved = isinstance(new.get("max_staleness"), dict)
    expected = "use 'learner.max_staleness.auto'" if moved else "dropping 'learner.staleness_auto'"
    assert expected in caplog.text


def test_an_old_auto_override_names_the_auto_section(caplog):
    with caplog.at_level(logging.WARNING, logger="config"):
        bound = load_config("tiny", ["learner.max_staleness=auto", "learner.staleness_auto.ceiling=3"])
    assert bound.learner.max_staleness.auto.ceiling == 3
    assert "use 'learner.max_staleness.auto.ceiling'" in caplog.text
