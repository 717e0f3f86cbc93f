"""Search-R1's `/rerank` API (its `rerank_server.py`, port 6980): the request, the answer, both sides' checks.

    request  {"queries": [str, ...], "documents": [[doc, ...], ...], "rerank_topk": 3, "return_scores": true}
             doc: {"id", "contents"} (a bare document), or {"document": {"id", "contents"}, "score"} (an entry of a
             /retrieve answer); one list per query
    answer   {"result": [[{"document": "(Title: T) text", "score": float}, ...], ...]}   one list per query, best
             first, at most rerank_topk entries; with "return_scores": false each entry is the string alone

An answer's document is the passage as Search-R1's reranker scores it: `(Title: {first line of contents}) {rest}`;
Search-R1's generation then shows it as `Doc {i}{document}`, the same bytes as `Doc {i}(Title: ...) ...` from a
plain search. An omitted, null or 0 `rerank_topk` means the server's default.

Where sr1's server differs from Search-R1's: it scores each query against its *own* documents (Search-R1's pairs
every query of the request with every document of the request and keeps the best overall); it answers every query,
one with no documents with an empty list (Search-R1's leaves such a query out, so later answers shift); its
cross-encoder reads the documents' `contents` as sr1's reranker does for /retrieve (Search-R1's reads the
`(Title: ...)` string). sr1's client (`retrieval/rerank_client.py`) sends one query per request, where both servers
pair the same documents.
"""

from __future__ import annotations

from typing import Any

from retrieval.api import RequestError, check_queries, load_json_object, return_scores_of
from retrieval.http_json import BadAnswer
from retrieval.settings import RetrievalConfig

TITLE_OPEN = "(Title: "


def passage_text(doc: dict) -> str:
    """`(Title: {title}) {text}`: a corpus document ({"contents": '"Title"\\ntext'}) as the reranker sees it."""
    title, _, text = str(doc.get("contents", "")).partition("\n")
    return f"{TITLE_OPEN}{title}) {text}"


def document_of(text: str) -> dict[str, str] | None:
    """A document whose `passage_text` is `text` (id unknown, ""), or None when `text` is not in that form. Search-R1's
    corpus quotes its titles, so the title ends at the first `") `; else at the first `) ` (the bytes shown are the
    same wherever it ends)."""
    if not text.startswith(TITLE_OPEN):
        return None
    rest = text[len(TITLE_OPEN) :]
    first_line = rest.split("\n", 1)[0]
    quoted = rest.startswith('"') and '") ' in first_line
    end = first_line.find('") ') + 1 if quoted else first_line.find(") ")
    if end < 0:
        return None
    return {"id": "", "contents": f"{rest[:end]}\n{rest[end + 2 :]}"}


# -- the client's side ---------------------------------------------------------------------------------------------


def rerank_request(query: str, documents: list[dict], topk: int) -> dict[str, Any]:
    """The body asking for the best `topk` of one query's `documents` ({"id", "contents"}), with scores."""
    return {
        "queries": [query],
        "documents": [[{"id": d.get("id", ""), "contents": d.get("contents", "")} for d in documents]],
        "rerank_topk": topk,
        "return_scores": True,
    }


def parse_rerank_answer(answer: Any, documents: list[dict], topk: int) -> tuple[list[dict], list[float]]:
    """One query's reranked documents (its own candidates, ids kept, where the answer's strings match them) and their
    scores (0.0 without scores), at most `topk`; `BadAnswer` naming what is wrong otherwise."""
    result = answer.get("result") if isinstance(answer, dict) else None
    if not isinstance(result, list) or len(result) != 1 or not isinstance(result[0], list):
        raise BadAnswer(
            "the reranker's answer has no 'result' list holding one list for the one query sent; got "
            f"{_shape(answer)}"
        )
    by_text = {passage_text(d): d for d in documents}
    docs, scores = [], []
    for i, entry in enumerate(result[0][:topk]):
        doc, score = entry, 0.0
        if isinstance(entry, dict):
            if "document" not in entry:
                raise BadAnswer(f"the reranker's result[0][{i}] has no 'document': {str(entry)[:120]}")
            doc, score = entry["document"], entry.get("score", 0.0)
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise BadAnswer(f"the reranker's result[0][{i}] has a score that is not a number: {score!r}")
        if isinstance(doc, dict) and isinstance(doc.get("contents"), str):
            found = {"id": str(doc.get("id", "")), "contents": doc["contents"]}
        elif isinstance(doc, str):
            found = by_text.get(doc) or document_of(doc)
            if found is None:
                raise BadAnswer(
                    f"the reranker's result[0][{i}] is neither one of the documents sent nor in the "
                    f"'(Title: ...) text' form: {doc[:120]!r}"
                )
        else:
            raise BadAnswer(
                f"the reranker's result[0][{i}] is not a document (a string or {{'contents': ...}}): {str(doc)[:120]}"
            )
        docs.append(found)
        scores.append(float(score))
    return docs, scores


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object with keys {sorted(value)[:8]}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__


# -- the server's side ---------------------------------------------------------------------------------------------


def _document(item: Any, where: str) -> dict[str, str]:
    """A bare document or a /retrieve answer's entry, as {"id", "contents"}."""
    doc = item.get("document", item) if isinstance(item, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
        raise RequestError(
            400, f"{where} must be a document {{'id', 'contents'}} or {{'document': {{...}}, 'score'}}"
        )
    return {"id": str(doc.get("id", "")), "contents": doc["contents"]}


def parse_rerank_request(body: bytes, cfg: RetrievalConfig) -> tuple[list[str], list[list[dict]], int, bool]:
    """Validate a /rerank body; (queries, each query's documents, topk, return_scores) or `RequestError`."""
    payload = load_json_object(body)
    queries = check_queries(payload.get("queries"), cfg)
    lists = payload.get("documents")
    if not isinstance(lists, list) or len(lists) != len(queries):
        raise RequestError(400, f"'documents' must be a list of {len(queries)} lists, one per query")
    documents = []
    for i, docs in enumerate(lists):
        if not isinstance(docs, list):
            raise RequestError(400, f"documents[{i}] must be a list of documents")
        if len(docs) > cfg.server.max_topk:
            raise RequestError(
                413, f"documents[{i}] holds {len(docs)} documents > max_topk ({cfg.server.max_topk})"
            )
        documents.append([_document(d, f"documents[{i}][{j}]") for j, d in enumerate(docs)])
    topk = payload.get("rerank_topk") or cfg.topk
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise RequestError(400, f"'rerank_topk' must be a positive integer, got {topk!r}")
    return queries, documents, topk, return_scores_of(payload)


def format_rerank_result(ranked: list[tuple[list[dict], list[float]]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's answer layout for each query's (documents, scores), best first."""
    if return_scores:
        return {
            "result": [
                [{"document": passage_text(d), "score": s} for d, s in zip(docs, scores, strict=True)]
                for docs, scores in ranked
            ]
        }
    return {"result": [[passage_text(d) for d in docs] for docs, _ in ranked]}
