"""Leaf helpers every package may import (docs/architecture.md, "Layers"); this package imports nothing of sr1's.

imports.py         an object named "module:attribute" (plug-ins from outside the repository: a reward function)
model_paths.py     a model or tokenizer path: a directory, a cached hub id, or a verl checkpoint merged on first use
verl_checkpoint.py verl FSDP actor checkpoints as Hugging Face model directories
sections.py        config sections several processes share: the model, the data, logging, evaluation
jobs.py            what every process's job (its typed config) has: seed, run directory, logging
progress.py        a long phase's progress: a bar in a terminal, a line every 10 s without one, the time left
"""
