"""`sr1`: the one command. A thin dispatcher: each subcommand's code lives in its own package and is imported only
when that subcommand runs, so `sr1 --help` answers at once.

    sr1 run [preset] [section.field=value ...]     the whole asynchronous system on this machine
    sr1 world [preset] [section.field=value ...]   the embedded world that run would use, built ahead
    sr1 launch [preset] [section.field=value ...]  the same on a Ray cluster (RAY_ADDRESS), parts placed by Ray
    sr1 retrieval serve|build-index ...            the retrieval service
    sr1 generators --config ...                    the generator pool alone
    sr1 learner --config ...                       the learner pool alone
    sr1 buffer watch|stats ...                     queue depth, staleness, workers
    sr1 data prepare --flashrag DIR --out DIR      Search-R1's train/test parquet from FlashRAG's datasets
    sr1 eval --run-dir RUN | --checkpoint DIR      evaluate a checkpoint per data source (search/direct/rag)
    sr1 ask "question" --checkpoint DIR            answer one question with a trained checkpoint
    sr1 config show|presets|reference ...          resolved configs and the field reference
    sr1 config from-search-r1 train_grpo.sh        a Search-R1 training script as an sr1 preset
    sr1 plan PRESET --gpus N --gpu-kind KIND ...   simulate every GPU split and staleness bound; recommend one
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with main(argv) -> int, or "module:function", one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": (
        "sr1.run",
        "run everything locally: Redis, retrieval, generators, learner (embedded tiny default)",
    ),
    "world": (
        "sr1.run:world_main",
        "build (or find cached) the embedded world a `sr1 run` with the same arguments uses",
    ),
    "launch": ("sr1.launch.cluster", "run everything on a Ray cluster (RAY_ADDRESS) or a local Ray instance"),
    "retrieval": ("sr1.entrypoints.retrieval", "serve retrieval (BM25/dense/online) or build an index"),
    "generators": (
        "sr1.launch.pools:generators_main",
        "launch the generator pool (vLLM engines running the agent)",
    ),
    "learner": (
        "sr1.launch.pools:learner_main",
        "launch the learner pool (FSDP2 ranks, weight broadcast, checkpoints)",
    ),
    "buffer": ("buffer.cli", "watch or query the Redis replay buffer (queue depth, staleness, workers)"),
    "data": (
        "tasks.search_r1.prepare:main",
        "build Search-R1's train/test parquet files from FlashRAG's QA datasets (local files or the hub)",
    ),
    "eval": ("sr1.evaluate", "evaluate a checkpoint on test files per data source (search, direct or RAG)"),
    "ask": ("sr1.ask", "answer one question with a checkpoint and a retrieval server, showing every search"),
    "config": ("config.cli", "resolved configs, presets, the field reference, Search-R1 scripts as presets"),
    "plan": ("sr1.plan.cli", "simulate every split of the GPUs and staleness bound before renting them"),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [
        "usage: sr1 <command> [args...]",
        "",
        "Asynchronous search-augmented RL (Search-R1 recipe).",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    lines += [
        "",
        "`sr1 <command> --help` for a command's options. `sr1 run` with no arguments runs the tiny default.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        if not argv:
            argv = ["run"]  # `sr1` alone runs the embedded default, like `sr1 run`
        else:
            print(_usage())
            return 0
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"sr1: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, function = SUBCOMMANDS[command][0].partition(":")
    entry = getattr(importlib.import_module(module_name), function or "main")
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
