"""`sr1 plan`: a discrete-event simulation of the pipeline, to choose the GPU split and the staleness bound before
renting the GPUs (`sr1/plan/cli.py`; docs/plan.md).

- `profile.py`: the figures a simulation needs, each with its source (files in `profiles/`, a finished run, a
  `bench_learner.py --json` output), the GPU kinds and the memory check;
- `simulate.py`: the discrete-event core (engines, searches, sr1's admission and batch assembly, learner, weight sync);
  `servers.py` its processor-sharing engines and retrieval server, `trajectories.py` the trajectories it draws,
  `admission.py` sr1's own admission and batch assembly run inside it;
- `search_r1.py`: Search-R1 as it runs (veRL's synchronous multi-turn loop), the baseline every split is compared with;
- `splits.py`: every split of the GPUs at every bound, the two baselines, the recommendation;
- `report.py`: the table, the JSON object and the PNG.
"""
