from retrieval.bm25 import BM25Retriever
from retrieval.corpus import DocStore


def test_finds_the_passage_that_shares_the_words(bm25):
    hits = bm25.search(["capital of Japan", "river in Africa"], 3)
    assert hits[0].docs[0]["id"] == "tokyo"
    assert hits[1].docs[0]["id"] == "nile"
    assert hits[0].scores == sorted(hits[0].scores, reverse=True)


def test_queries_without_known_words_get_no_documents(bm25):
    hits = bm25.search(["the of and", "xyzzyqwerty", "?!"], 3)
    assert [h.docs for h in hits] == [[], [], []]


def test_empty_query_gets_the_first_k_passages_with_score_zero(bm25):
    hits = bm25.search(["", " \t\n", "capital of Japan"], 3)
    for blank in hits[:2]:
        assert [d["id"] for d in blank.docs] == ["paris", "tokyo", "nile"]  # corpus rows 0, 1, 2
        assert blank.scores == [0.0, 0.0, 0.0]
    assert hits[2].docs[0]["id"] == "tokyo" and hits[2].scores[0] > 0
    assert len(bm25.search([""], 40)[0].docs) == 40
    original = bm25.scorer
    try:
        bm25.scorer = "bm25s"  # the answer does not depend on the scorer
        assert bm25.search([""], 3)[0].docs == hits[0].docs
    finally:
        bm25.scorer = original


def test_batched_equals_one_at_a_time(bm25):
    queries = ["capital of France", "silver bridge", "Norvale river", "ancient temple of Estria"]
    batched = bm25.search(queries, 5)
    for q, b in zip(queries, batched, strict=True):
        single = bm25.search([q], 5)[0]
        assert [d["id"] for d in single.docs] == [d["id"] for d in b.docs]
        assert single.scores == b.scores


def test_topk_larger_than_corpus_is_clamped(tmp_path):
    from retrieval.corpus import write_corpus_jsonl

    path = tmp_path / "c.jsonl"
    write_corpus_jsonl(
        path, [{"id": "a", "contents": '"A"\napple pie'}, {"id": "b", "contents": '"B"\napple tree'}]
    )
    r = BM25Retriever.build(DocStore(path))
    assert {d["id"] for d in r.search(["apple"], 50)[0].docs} == {"a", "b"}
    assert [d["id"] for d in r.search([""], 50)[0].docs] == ["a", "b"]


def test_save_and_load_give_the_same_results(bm25, corpus_path, tmp_path):
    bm25.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx", DocStore(corpus_path))
    q = ["largest city of France"]
    assert loaded.search(q, 3)[0].docs == bm25.search(q, 3)[0].docs


def test_query_tokenisation_matches_bm25s(bm25):
    import bm25s

    queries = ["The Capitals of FRANCE's cities!", "running runners ran quickly", "x y zz"]
    tokens = bm25s.tokenize(queries, stopwords="en", stemmer=bm25.stemmer, show_progress=False)
    inv = {v: w for w, v in tokens.vocab.items()}
    vocab = bm25.model.vocab_dict
    expected = [[vocab[inv[t]] for t in q if inv[t] in vocab] for q in tokens.ids]
    assert [bm25.query_term_ids(q) for q in queries] == expected
    assert expected[0]  # the check is not vacuous
