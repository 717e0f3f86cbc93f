"""`sr1 retrieval` argument parsing: --method choices from the retriever union, flags as config keys, and dotted
overrides anywhere, parsed by the config loader."""

import pytest

from retrieval.settings import indexable_methods
from retrieval.union import RETRIEVERS
from sr1.entrypoints.retrieval import flag_overrides, load_retrieval_config, main, parse_args


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--workers", "2", "retrieval.server.torch_threads=1"],
        ["serve", "retrieval.server.torch_threads=1", "--workers", "2"],
        ["serve", "--workers", "2", "retrieval.server.torch_threads=1", "--no-batching", "retrieval.topk=5"],
        ["serve", "retrieval.topk=5", "--workers=2", "retrieval.server.torch_threads=1", "--no-batching"],
    ],
)
def test_overrides_may_come_before_between_or_after_options(argv):
    args = parse_args(argv)
    assert args.command == "serve"
    cfg = load_retrieval_config(args)
    assert (cfg.server.torch_threads, cfg.server.workers) == (1, 2)
    assert cfg.topk == (5 if "retrieval.topk=5" in argv else 3)
    assert cfg.server.batching == ("--no-batching" not in argv)


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
        (["build-index", "--method", "google", "--out", "x"], "invalid choice: 'google'"),
    ],
)
def test_anything_else_is_an_error_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_method_choices_come_from_the_union():
    for name in RETRIEVERS:
        assert load_retrieval_config(parse_args(["serve", "--method", name])).retriever.method == name
    for name in indexable_methods():
        assert parse_args(["build-index", "--method", name, "--out", "x"]).overrides == []


def test_flags_are_config_keys_and_win_over_overrides(tmp_path):
    args = parse_args(
        ["serve", "--port", "9", "--token", "0123", "retrieval.server.port=7", "--index", str(tmp_path)]
    )
    assert flag_overrides(args) == [
        f"retrieval.retriever.index_path={str(tmp_path)!r}".replace("'", '"'),
        "retrieval.server.port=9",
        'retrieval.token="0123"',
    ]
    cfg = load_retrieval_config(args)
    assert (cfg.server.port, cfg.token, cfg.retriever.index_path) == (
        9,
        "0123",
        tmp_path,
    )  # a string, not 123


def test_bad_keys_and_knobs_of_another_retriever_are_errors_naming_them(capsys):
    with pytest.raises(SystemExit, match="unknown config key 'retrieval.server.prot'; did you mean port"):
        load_retrieval_config(parse_args(["serve", "retrieval.server.prot=1"]))
    with pytest.raises(SystemExit, match="faiss_index is a setting of dense, not of 'bm25'"):
        load_retrieval_config(parse_args(["serve", "--method", "bm25", "--faiss-index", "HNSW64"]))


def test_build_index_refuses_a_retriever_without_an_index(tmp_path, capsys):
    assert main(["build-index", "--out", str(tmp_path / "idx"), "retrieval.retriever.method=brave"]) == 2
    assert "build-index supports --method bm25 or dense, not 'brave'" in capsys.readouterr().err
    assert main(["build-index", "--out", str(tmp_path / "idx"), "--method", "bm25"]) == 2
    assert "build-index needs a corpus (--corpus" in capsys.readouterr().err


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
    dense = cfg.retriever
    assert (dense.index_path, dense.corpus_path) == (tmp_path / "e5_Flat.index", tmp_path / "c.jsonl")
    assert (cfg.topk, dense.method, dense.encoder.model, dense.faiss_gpu) == (
        5,
        "dense",
        "intfloat/e5-base-v2",
        True,
    )
    assert cfg.client.url == "http://h:9/retrieve"
    bm25 = load_retrieval_config(parse_args(["serve", "--retriever_name", "bm25", "retriever.topk=7"]))
    assert (bm25.retriever.method, bm25.topk) == ("bm25", 7)
    searched = load_retrieval_config(parse_args(["serve", "search_url=http://x:1/r", "topk=2"]))
    assert (searched.client.url, searched.topk) == ("http://x:1/r", 2)


def test_search_r1_rerank_server_flags_are_aliases(tmp_path):
    """retrieval_launch_hierarchical.sh's command: retrieve 10 candidates, rerank, keep 3."""
    argv = ["serve", "--retriever_name", "bm25", "--retrieval_topk", "10", "--reranking_topk", "3"]
    argv += ["--reranker_model", str(tmp_path / "xenc"), "--reranker_batch_size", "32"]
    cfg = load_retrieval_config(parse_args(argv))
    assert cfg.reranks_searches and cfg.reranker.model == str(tmp_path / "xenc")
    assert (cfg.reranker.candidates, cfg.topk, cfg.reranker.batch_size) == (10, 3, 32)
    assert not load_retrieval_config(parse_args(["serve", "--retrieval_topk", "10"])).reranker.enabled
