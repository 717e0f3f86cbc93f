"""Durability: the checkpoints a restart resumes from and that transformers and vLLM load, written so that a crash or
a full disk never leaves a torn one, and what the learner does when one cannot be written.

    checkpointer = Checkpointer(run_dir / "checkpoints", world, model_dir, keep=2)   # checkpointer.py; learner/steps.py
    latest_checkpoint(run_dir / "checkpoints")                                       # sr1's summary and evaluation

`checkpointer.py` saves and resumes; `files.py` writes durably and checks the manifest, `hf_weights.py` streams the
weights, `adapters.py` writes LoRA's side, `safety_net.py` decides whether a failed save stops the run.

Why a wing: a module belongs here when it is about what outlives the process (the files, their manifest, their
order of writing, the failures of writing them), not about the step. What is saved (the model and its optimizer,
PPO's critic, the resume state's contents) and when (every `learner.checkpoint_every` steps, acks after) is the step's
and stays at the learner's root; so does `lora.py`, which decides which parameters train: `adapters.py` only saves
and loads them.
"""
