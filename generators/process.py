"""One generator worker process: start its vLLM engine, build the task, run one `GeneratorWorker` until a signal.

    exit_code = asyncio.run(run_worker_process(job, tokenizer, tokenizer_path, test_prompts))

The entry point (`sr1/entrypoints/generators.py`) loads the job and reads the test prompts first, so that a bad job
or a bad test file stops the process before the engine starts; this module owns everything after: the engine, the
task with its retrieval client, the worker, and the signals. SIGTERM/SIGINT ask the worker to drain and stop; one that
arrives while the engine starts is remembered and honoured as soon as the worker exists. The engine, the task's
client and the Redis connection are closed whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from buffer.redis_buffer import open_buffer
from common.model_paths import resolve_model_path
from generators.engine import DIE_WITH_PARENT_ENV, VLLMEngine, serving_process
from generators.job import GeneratorJob
from generators.worker import GeneratorWorker
from tasks import build_task

log = logging.getLogger("generators")


async def run_worker_process(
    job: GeneratorJob, tokenizer: Any, tokenizer_path: str, test_prompts: list | None
) -> int:
    """Start the engine and run the worker until a signal; returns the worker's exit code. `test_prompts` are
    the prompts the worker evaluates on (None without data.test_files: it answers no evaluation requests)."""
    # a SIGTERM while the engine starts must still shut the engine down: remember it, stop right after
    stop_requested: list[bool] = []
    worker: GeneratorWorker | None = None

    def on_signal() -> None:
        stop_requested.append(True)
        if worker is not None:
            worker.request_stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    gen = job.generators
    model_path = str(resolve_model_path(job.model.path))  # a directory, or a hub id in the local HF cache
    os.environ[DIE_WITH_PARENT_ENV] = "1"  # the engine's processes die with this one (a vLLM plugin reads it)
    max_model_len = gen.engine.max_model_len or job.model.max_seq_len
    buffer = open_buffer(job.buffer)
    log.info("worker %s: starting engine on %s", job.worker_id, model_path)
    engine = VLLMEngine.create(
        model_path,
        gen.engine,
        dtype=job.model.dtype,
        max_model_len=max_model_len,
        tokenizer_path=tokenizer_path,
        seed_offset=job.engine_index,
        version=0,
        lora=gen.lora,
    )
    task = build_task(job.task, retrieval=job.retrieval)

    def eval_prompts() -> list:
        return test_prompts or []

    try:
        worker = GeneratorWorker(
            gen,
            buffer,
            engine,
            tokenizer,
            task,
            worker_id=job.worker_id,
            max_model_len=max_model_len,
            max_prompt_tokens=job.model.max_prompt_tokens,
            chat_template=job.model.chat_template,
            eval_prompts=eval_prompts if test_prompts is not None else None,
            eval_max_turns=job.eval.max_turns,
            eval_seed=job.seed,
        )
        await asyncio.sleep(0)  # deliver a signal that arrived during the engine start
        if stop_requested:
            worker.request_stop()
        # settled in while it serves: vLLM's environment cached, the garbage collector kept off the startup heap
        with serving_process():
            return await worker.run()
    finally:
        await task.close()
        engine.shutdown()
        buffer.close()
