"""Search-R1's `/retrieve` API: request validation and the answer layout, shared by the server (`retrieval.server`).

    request  {"queries": [str, ...], "topk": 3, "return_scores": true}
    answer   {"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}
             (with "return_scores": false each entry is the bare document, as Search-R1's server meant)

As in Search-R1's server, fields other than these three are ignored (`parse_retrieve_request` reports their names,
the server counts them); every malformed body is a `RequestError` (an HTTP 4xx with a JSON reason), never a crash.
"""

from __future__ import annotations

import json
from typing import Any

from retrieval.base import Hits
from retrieval.settings import RetrievalConfig

REQUEST_FIELDS = ("queries", "topk", "return_scores")


class RequestError(Exception):
    """A client mistake: becomes an HTTP 4xx with a JSON reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _load_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except RecursionError:  # deeply nested arrays/objects: the decoder recurses once per level
        raise RequestError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers over Python's 4300-digit limit
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None


def load_json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object; `RequestError` otherwise."""
    payload = _load_json(body)
    if not isinstance(payload, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(payload).__name__}")
    return payload


def check_queries(queries: Any, cfg: RetrievalConfig) -> list[str]:
    """`queries` as a request gives them: a list of at most `max_queries_per_request` strings of valid Unicode, each
    at most `max_query_chars` long; `RequestError` naming the first that is not."""
    if not isinstance(queries, list):
        raise RequestError(400, f"'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > cfg.server.max_queries_per_request:
        raise RequestError(
            413,
            f"too many queries: {len(queries)} > max_queries_per_request ({cfg.server.max_queries_per_request})",
        )
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(400, f"queries[{i}] must be a string, got {type(q).__name__}")
        if len(q) > cfg.server.max_query_chars:
            raise RequestError(
                413, f"queries[{i}] has {len(q)} characters > max_query_chars ({cfg.server.max_query_chars})"
            )
        try:  # JSON may spell lone surrogates (\ud800); tokenizers fail on them, and with them a whole batch
            q.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(
                400, f"queries[{i}] is not valid Unicode: {exc.reason} at {exc.start}"
            ) from None
    return queries


def parse_retrieve_request(
    body: bytes, cfg: RetrievalConfig, ignored_fields: list[str] | None = None
) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; returns (queries, topk, return_scores) or raises `RequestError`.

    Fields other than `REQUEST_FIELDS` are ignored, as Search-R1's server ignores them; their names are appended
    to `ignored_fields` when a list is given."""
    payload = load_json_object(body)
    if ignored_fields is not None:
        ignored_fields.extend(name for name in payload if name not in REQUEST_FIELDS)
    if "queries" not in payload:
        raise RequestError(400, "missing 'queries' (a list of strings)")
    queries = check_queries(payload["queries"], cfg)
    topk = payload.get("topk")
    if topk is None:
        topk = cfg.topk
    if not isinstance(topk, int) or isinstance(topk, bool):
        raise RequestError(400, f"'topk' must be an integer, got {type(topk).__name__}")
    if not 1 <= topk <= cfg.server.max_topk:
        raise RequestError(400, f"'topk' must be between 1 and {cfg.server.max_topk}, got {topk}")
    return queries, topk, return_scores_of(payload)


def return_scores_of(payload: dict[str, Any]) -> bool:
    """A request's `return_scores` (absent or null: false)."""
    return_scores = payload.get("return_scores")
    if return_scores is None:
        return False
    if not isinstance(return_scores, bool):
        raise RequestError(400, f"'return_scores' must be true or false, got {type(return_scores).__name__}")
    return return_scores


def format_result(hits: list[Hits], return_scores: bool) -> dict[str, Any]:
    """Search-R1's answer layout."""
    if return_scores:
        return {
            "result": [
                [{"document": d, "score": s} for d, s in zip(h.docs, h.scores, strict=True)] for h in hits
            ]
        }
    return {"result": [list(h.docs) for h in hits]}
