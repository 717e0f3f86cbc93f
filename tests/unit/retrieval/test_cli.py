"""`sr1 retrieval` argument parsing: registry-driven --method choices and dotted overrides anywhere."""

import pytest

from retrieval.cli import load_retrieval_config, main, parse_args
from retrieval.settings import METHODS


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--workers", "2", "retrieval.torch_threads=1"],
        ["serve", "retrieval.torch_threads=1", "--workers", "2"],
        ["serve", "--workers", "2", "retrieval.torch_threads=1", "--no-batching", "retrieval.topk=5"],
        ["serve", "retrieval.topk=5", "--workers=2", "retrieval.torch_threads=1", "--no-batching"],
    ],
)
def test_overrides_may_come_before_between_or_after_options(argv):
    args = parse_args(argv)
    assert args.command == "serve" and args.workers == 2
    cfg = load_retrieval_config(args)
    assert (cfg.torch_threads, cfg.workers) == (1, 2)
    assert cfg.topk == (5 if "retrieval.topk=5" in argv else 3)
    assert cfg.batching == ("--no-batching" not in argv)


def test_overrides_keep_their_order_and_reach_build_index(tmp_path):
    args = parse_args(["build-index", "retrieval.topk=4", "--out", str(tmp_path), "retrieval.topk=6"])
    assert args.overrides == ["retrieval.topk=4", "retrieval.topk=6"]
    assert load_retrieval_config(args).topk == 6


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["serve", "--workers", "2", "bogus"], "unrecognized arguments: bogus"),
        (["serve", "retrieval.topk=5", "--nope", "3"], "unrecognized arguments: --nope 3"),
        (["serve", "=5", "--workers", "2"], "unrecognized arguments: =5"),
        (["serve", "--method", "bm26"], "invalid choice: 'bm26'"),
    ],
)
def test_anything_else_is_an_error_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_method_choices_come_from_the_registry():
    for name in METHODS:
        assert parse_args(["serve", "--method", name]).method == name


def test_build_index_refuses_an_online_method(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n')
    with pytest.raises(SystemExit, match="build-index supports --method bm25 or dense, not 'google'"):
        main(["build-index", "--method", "google", "--corpus", str(corpus), "--out", str(tmp_path / "idx")])


def test_search_r1_retrieval_server_flags_and_keys_are_aliases(tmp_path):
    argv = [
        "serve",
        "--index_path",
        str(tmp_path / "e5_Flat.index"),
        "--corpus_path",
        str(tmp_path / "c.jsonl"),
        "--topk",
        "5",
        "--retriever_name",
        "e5",
        "--retriever_model",
        "intfloat/e5-base-v2",
        "--faiss_gpu",
        "retriever.url=http://h:9/retrieve",
    ]
    cfg = load_retrieval_config(parse_args(argv))
    assert (cfg.index_path, cfg.corpus_path) == (tmp_path / "e5_Flat.index", tmp_path / "c.jsonl")
    assert (cfg.topk, cfg.method, cfg.encoder.model, cfg.faiss_gpu) == (
        5,
        "dense",
        "intfloat/e5-base-v2",
        True,
    )
    assert cfg.url == "http://h:9/retrieve"
    bm25 = load_retrieval_config(parse_args(["serve", "--retriever_name", "bm25", "retriever.topk=7"]))
    assert (bm25.method, bm25.topk) == ("bm25", 7)
    assert (
        load_retrieval_config(parse_args(["serve", "search_url=http://x:1/r", "topk=2"])).url
        == "http://x:1/r"
    )


def test_search_r1_rerank_server_flags_are_aliases(tmp_path):
    """retrieval_launch_hierarchical.sh's command: retrieve 10 candidates, rerank, keep 3."""
    argv = ["serve", "--retriever_name", "bm25", "--retrieval_topk", "10", "--reranking_topk", "3"]
    argv += ["--reranker_model", str(tmp_path / "xenc"), "--reranker_batch_size", "32"]
    cfg = load_retrieval_config(parse_args(argv))
    assert cfg.reranks_searches and cfg.reranker.model == str(tmp_path / "xenc")
    assert (cfg.reranker.candidates, cfg.topk, cfg.reranker.batch_size) == (10, 3, 32)
    assert not load_retrieval_config(parse_args(["serve", "--retrieval_topk", "10"])).reranker.enabled
