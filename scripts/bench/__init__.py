"""Benchmarks and the workloads and baselines they share: each prints ratios against a baseline measured in the same
run (docs/benchmarks.md). Run by path: `python scripts/bench/bench_buffer.py --help`."""
