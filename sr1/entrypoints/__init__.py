"""The processes of a run, one entry point each: parse the command line, load the process's job (`config/`), run it.

    python -m sr1.entrypoints.learner --config JOB_OR_PRESET [overrides]      # one learner rank (torchrun -m too)
    python -m sr1.entrypoints.generators --config JOB_OR_PRESET [overrides]   # one generator worker
    python -m sr1.entrypoints.retrieval serve|build-index ...                 # `sr1 retrieval`

They sit in the top layer, above `config/`, so that the pools' packages never import the config: a pool defines its
job from its own settings (`learner/job.py`, `generators/job.py`, `retrieval/job.py`), `config/` composes the jobs
from the root config, and an entry point loads its job and hands it to the pool's code. Launchers (`sr1 run`,
`sr1 learner`, `sr1 generators`, `sr1 launch`) start these modules by the names below. Each answers `--help` without
importing torch or vLLM.
"""

LEARNER = "sr1.entrypoints.learner"
GENERATORS = "sr1.entrypoints.generators"
RETRIEVAL = "sr1.entrypoints.retrieval"
