"""Generators: vLLM engines running the Search-R1 agent loop and streaming rewarded GRPO groups into Redis.

job.py          the sections a generator process uses (its entry point: sr1/entrypoints/generators.py)
settings.py     the `generators` config section: engines, the agent loop, rewards, the worker
engine.py       token-in/token-out wrapper over vLLM's AsyncLLM (log-probs, per-token versions, weight updates)
hf_engine.py    the same `Engine` over a transformers model (`sr1 ask`, the tiny world's check)
agent.py        one trajectory: multi-turn generation + the task's tool, token-level masks/log-probs/versions
group.py        the n samples of a prompt, scored by the task into a `Group`
worker.py       one engine's worker: claim, run, put, heartbeat, follow weights, drain on SIGTERM
process.py      one worker process: start the engine, build the task, run the worker until a signal
tool_health.py  whether the worker's tool (the retriever) is healthy enough to sample with
evaluation.py   answering a shard of test prompts (greedy, per data source)
"""
