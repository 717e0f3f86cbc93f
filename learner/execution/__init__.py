"""How a learner step runs on this device: which attention kernel, compiled layers or eager ones, what the backward
recomputes, which log-prob head, what fits in the GPU's memory, and how tensors reach the device.

    execution = plan_execution(cfg.learner, model_path, world, "bfloat16", reference=True, critic=False)   # plan.py

`plan.py` decides all of it once, before any model is loaded, and logs it; the root applies it: `model.py` wraps each
decoder layer (`recompute.py`, `compiled.py`) and picks the attention (`attention.py`), `packing.py` runs the head
(`chunked_logprobs.py`, `fused_head.py`) and copies micro-batches (`device.py`), `trainer.py` asks for the plan.

Why a wing: a module belongs here when changing it changes how fast a step runs or how much memory it takes, never
what it computes (every kernel and head gives the same log-probs and gradients within tolerance; the tests compare
them). What the step computes stays at the learner's root: the algorithms, the packed micro-batches and their targets
(`packing.py`, whose sequence boundaries the kernels read), the mini-batches, the sharded model and its optimizer.
"""
