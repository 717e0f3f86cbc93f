"""Fault injection and the soak: `chaos.py` kills, freezes, cuts and tears parts of a running `sr1 run` and checks
that it recovers; `soak.py` watches a long run's memory (docs/reliability.md,
docs/measurements/memory-over-hours.md). Run by path: `python scripts/chaos/chaos.py --help`."""
