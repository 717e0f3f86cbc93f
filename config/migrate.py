"""Old config keys that still load, with a warning naming the new key.

The flat learner keys of earlier versions moved into the algorithm and correction unions, the reward moved to the
task section, and the flat retrieval section split into the retriever union and the server's and client's sections:

    learner.advantage: drgrpo          ->  learner.algorithm.type: drgrpo
    learner.clip_low / clip_high / kl_coef / entropy_coef  ->  learner.algorithm.<same>
    learner.proximal / tis_cap / icepop_low / icepop_high  ->  learner.correction.proximal / cap / low / high
    generators.reward: f1              ->  task.reward: f1
    retrieval.method / corpus_path / index_path / encoder / faiss_* / hnsw_ef_search / ivf_nprobe
                                       ->  retrieval.retriever.<same>
    retrieval.bm25_k1 / bm25_b / bm25_threads  ->  retrieval.retriever.k1 / b / threads
    retrieval.online.<key>             ->  retrieval.retriever.<key> (google_cx_env: cx_env)
    retrieval.host / port / workers / cache_size / torch_threads / ...  ->  retrieval.server.<same>
    retrieval.url / timeout_s / max_retries / backoff_s  ->  retrieval.client.<same>
    learner.staleness_auto.<key>       ->  learner.max_staleness.auto.<key>

A moved key that the chosen member of its union does not have (`tis_cap` beside `correction: icepop`, or
`faiss_index` beside `method: bm25`, which every saved config of an earlier version holds) was ignored then and is
dropped now, so old run directories resume as they were. `learner.correction: icepop` needs no migration: a bare
variant name is the union's shorthand. Likewise `learner.staleness_auto` beside a fixed `learner.max_staleness` (every
saved config of an earlier version holds it) did nothing and is dropped; beside `max_staleness: auto` it becomes the
auto section. A dotted override of it always names the auto section, which makes the bound auto.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from config.schema import Config
from config.unions import section_models, union_tag
from learner.settings import LearnerConfig

log = logging.getLogger("config")

_RETRIEVER_KEYS = (
    "method",
    "corpus_path",
    "index_path",
    "encoder",
    "faiss_index",
    "flat_search",
    "faiss_gpu",
)
_SERVER_KEYS = (
    *(
        "host",
        "port",
        "max_topk",
        "batch_window_ms",
        "max_batch_queries",
        "batching",
        "cache_size",
        "workers",
    ),
    *("max_body_bytes", "max_queries_per_request", "max_query_chars", "torch_threads"),
)

# old key (or section: every key under it) -> new key
RENAMED: dict[str, str] = {
    "generators.reward": "task.reward",
    "learner.advantage": "learner.algorithm.type",
    "learner.clip_low": "learner.algorithm.clip_low",
    "learner.clip_high": "learner.algorithm.clip_high",
    "learner.kl_coef": "learner.algorithm.kl_coef",
    "learner.entropy_coef": "learner.algorithm.entropy_coef",
    "learner.proximal": "learner.correction.proximal",
    "learner.tis_cap": "learner.correction.cap",
    "learner.icepop_low": "learner.correction.low",
    "learner.icepop_high": "learner.correction.high",
    "learner.staleness_auto": "learner.max_staleness.auto",
    **{f"retrieval.{key}": f"retrieval.retriever.{key}" for key in _RETRIEVER_KEYS},
    "retrieval.hnsw_ef_search": "retrieval.retriever.hnsw_ef_search",
    "retrieval.ivf_nprobe": "retrieval.retriever.ivf_nprobe",
    "retrieval.bm25_k1": "retrieval.retriever.k1",
    "retrieval.bm25_b": "retrieval.retriever.b",
    "retrieval.bm25_threads": "retrieval.retriever.threads",
    "retrieval.online.google_cx_env": "retrieval.retriever.cx_env",
    "retrieval.online": "retrieval.retriever",
    **{f"retrieval.{key}": f"retrieval.server.{key}" for key in _SERVER_KEYS},
    **{
        f"retrieval.{key}": f"retrieval.client.{key}"
        for key in ("url", "timeout_s", "max_retries", "backoff_s")
    },
}
# old key -> why it is gone (it did nothing)
REMOVED: dict[str, str] = {
    "retrieval.online.snippet_only": "online engines always use the result snippet as the passage",
}


def renamed_key(dotted: str, origin: str) -> str | None:
    """The current name of a dotted key, None for a removed one (a deprecated one is logged)."""
    if dotted in REMOVED:
        log.warning("%s: config key %r is gone (%s); ignoring it", origin, dotted, REMOVED[dotted])
        return None
    parts = dotted.split(".")
    for depth in range(len(parts), 0, -1):  # the key itself, else the closest section above it
        new = RENAMED.get(".".join(parts[:depth]))
        if new is not None:
            new = ".".join([new, *parts[depth:]])
            log.warning("%s: config key %r is deprecated; use %r", origin, dotted, new)
            return new
    return dotted


def _fields(models: list[type[BaseModel]]) -> dict[str, Any]:
    return {name: field for model in models for name, field in model.model_fields.items()}


def _section(values: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """The dict at `keys` in `values`, made where missing (a union section's shorthand `correction: tis` becomes
    `{"type": "tis"}`)."""
    node, models = values, [Config]
    for key in keys:
        field = _fields(models).get(key)
        models = section_models(field.annotation) if field is not None else []
        child = node.get(key)
        if isinstance(child, str) and field is not None and union_tag(field):
            child = {union_tag(field): child}
        node[key] = child if isinstance(child, dict) else {}
        node = node[key]
    return node


def _move(values: dict[str, Any], old: str, origin: str) -> list[str]:
    """Move the value at `old` (if any) to its new key, without replacing a value given there; returns the new keys
    it filled."""
    *parents, leaf = old.split(".")
    holder: Any = values
    for key in parents:
        holder = holder.get(key) if isinstance(holder, dict) else None
    if not isinstance(holder, dict) or leaf not in holder:
        return []
    value = holder.pop(leaf)
    new = renamed_key(old, origin)
    assert new is not None
    *new_parents, new_leaf = new.split(".")
    target = _section(values, new_parents)
    if isinstance(value, dict) and isinstance(target.get(new_leaf), dict):  # a section into one that exists
        into = target[new_leaf]
        filled = [key for key in value if key not in into]
        into.update({key: value[key] for key in filled})
        return [f"{new}.{key}" for key in filled]
    if new_leaf in target:
        return []
    target[new_leaf] = value
    return [new]


def _drop_if_not_the_members(values: dict[str, Any], dotted: str, origin: str) -> None:
    """Drop a moved key that lies in a union section whose chosen member has no such field."""
    keys = dotted.split(".")
    node, models = values, [Config]
    for depth, key in enumerate(keys[:-1]):
        field = _fields(models).get(key)
        node = node.get(key) if isinstance(node, dict) else None
        if field is None or not isinstance(node, dict):
            return
        models, tag = section_models(field.annotation), union_tag(field)
        if tag:
            name = node.get(tag, getattr(field.get_default(call_default_factory=True), tag))
            models = [m for m in models if m.model_fields[tag].default == name] or models
            if len(models) == 1 and keys[depth + 1] not in models[0].model_fields:
                node.pop(keys[depth + 1])
                where = ".".join(keys[: depth + 1])
                log.warning(
                    "%s: dropping %r: %s %r has no such setting (earlier versions ignored it)",
                    origin,
                    dotted,
                    where,
                    name,
                )
                return


def _drop_unused_auto_section(values: dict[str, Any], origin: str) -> None:
    """`learner.staleness_auto` beside a bound that is not `auto` (a number, or none: the default 2) was ignored."""
    learner = values.get("learner")
    if not isinstance(learner, dict) or "staleness_auto" not in learner:
        return
    bound = learner.get("max_staleness", LearnerConfig.model_fields["max_staleness"].default)
    if isinstance(bound, dict) or (isinstance(bound, str) and bound.strip() == "auto"):
        return
    learner.pop("staleness_auto")
    log.warning(
        "%s: dropping 'learner.staleness_auto': learner.max_staleness is the fixed bound %r, which ignored it "
        "(an adaptive bound is now learner.max_staleness: {auto: {floor: ..., ceiling: ...}})",
        origin,
        bound,
    )


def migrate(values: dict[str, Any], origin: str) -> dict[str, Any]:
    """Move deprecated keys of one source (a YAML file) to their new places, in place; returns `values`."""
    for old in REMOVED:
        *parents, leaf = old.split(".")
        holder: Any = values
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and leaf in holder:
            holder.pop(leaf)
            renamed_key(old, origin)
    _drop_unused_auto_section(values, origin)
    moved: list[str] = []
    for old in sorted(RENAMED, key=lambda key: -key.count(".")):  # a key before the section that holds it
        moved += _move(values, old, origin)
    for dotted in moved:
        _drop_if_not_the_members(values, dotted, origin)
    return values
