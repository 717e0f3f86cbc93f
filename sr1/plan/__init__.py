"""`sr1 plan`: a discrete-event simulation of the pipeline, to choose the GPU split and the staleness bound before
renting the GPUs (`sr1/plan/cli.py`; docs/plan.md).

- `profile.py`: the figures a simulation needs, each with its source (files in `profiles/`, a finished run, a
  `bench_learner.py --json` output), the GPU kinds and the memory check;
- `simulate.py`: the discrete-event core (engines, searches, sr1's admission and batch assembly, learner, weight sync);
- `splits.py`: every split of the GPUs at every bound, the colocated synchronous baseline, the recommendation;
- `report.py`: the table, the JSON object and the PNG.
"""
