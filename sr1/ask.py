"""`sr1 ask`: answer one question with a checkpoint and a running retrieval server, showing the reasoning, every
search with its results, and the answer (what Search-R1's `infer.py` does).

    sr1 ask "In which city was Velmora Tesk born?" --checkpoint runs/tiny-.../checkpoints/step_40 \
        --retrieval-url http://127.0.0.1:8000/retrieve

The checkpoint is any HF model directory. `--engine hf` (default) runs transformers in-process and starts at once;
`--engine vllm` starts a vLLM engine (worth it for large models on a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any


def _load_config(checkpoint: Path, config_arg: str | None, overrides: list[str]):
    from config import load_config

    if config_arg:
        return load_config(config_arg, overrides)
    run_config = checkpoint.parent.parent / "config.yaml"  # <run_dir>/checkpoints/step_N
    if run_config.is_file():
        return load_config(run_config, overrides)
    return load_config("tiny", overrides)


async def ask(
    question: str, checkpoint: Path, retrieval_url: str, cfg: Any, engine_kind: str
) -> dict[str, Any]:
    from rich.console import Console
    from rich.panel import Panel

    from generators.agent import AgentSettings, run_agent
    from tasks import build_task
    from tasks.prompt_tokens import encode_prompt

    console = Console()
    if engine_kind == "vllm":
        from transformers import AutoTokenizer

        from generators.engine import VLLMEngine

        engine = VLLMEngine.create(
            str(checkpoint),
            cfg.generators.engine,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_seq_len,
            weight_sync=False,
        )
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    else:
        from generators.hf_engine import TransformersEngine

        engine = TransformersEngine(str(checkpoint))
        tokenizer = engine.tokenizer
    task = build_task(cfg.task, retrieval=cfg.retrieval.sending_to(retrieval_url))
    prompt_ids = encode_prompt(
        tokenizer, task.prompt_messages(question), chat_template=cfg.model.chat_template
    )
    settings = AgentSettings.from_config(cfg.generators, cfg.model.max_seq_len)
    try:
        rollout = await run_agent(engine, prompt_ids, task, tokenizer, settings, greedy=True)
    finally:
        await task.close()
    console.print(Panel(question, title="question", border_style="cyan"))
    for turn, text in enumerate(rollout.turn_texts):
        console.print(
            Panel(text.strip() or "(nothing)", title=f"model, turn {turn + 1}", border_style="white")
        )
        if turn < len(rollout.observations):
            console.print(
                Panel(rollout.observations[turn].strip(), title="observation", border_style="yellow")
            )
    answer = task.score(rollout, []).metrics.get("answer")
    console.print(
        Panel(answer if answer is not None else "(no answer)", title="answer", border_style="green")
    )
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return {"answer": answer, "tool_inputs": rollout.tool_inputs, "finish_reason": rollout.finish_reason}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sr1 ask", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("question")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="HF model directory (a run's checkpoint) or a verl FSDP actor checkpoint",
    )
    parser.add_argument(
        "--retrieval-url", help="POST /retrieve endpoint (default: retrieval.client.url of the config)"
    )
    parser.add_argument(
        "--config", help="preset or YAML (default: the run's config.yaml next to checkpoints/)"
    )
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_intermixed_args(argv)
    from common.model_paths import ModelPathError, resolve_model_path

    try:  # a verl checkpoint is merged into an HF directory here
        model_dir = resolve_model_path(args.checkpoint, what="--checkpoint")
    except ModelPathError as err:
        print(f"sr1 ask: {err}", file=sys.stderr)
        return 2
    if not (model_dir / "config.json").is_file():
        print(f"sr1 ask: {args.checkpoint} is not an HF model directory (no config.json)", file=sys.stderr)
        return 2
    cfg = _load_config(args.checkpoint, args.config, args.overrides)
    url = args.retrieval_url or cfg.retrieval.client.url
    asyncio.run(ask(args.question, model_dir, url, cfg, args.engine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
