"""The repository's scripts: tools at the top (set-up, the layer check, the generated docs, the tiny world, the GPU
call), benchmarks in `bench/`, fault injection and the soak in `chaos/`.

Scripts are run by path (`python scripts/bench/bench_buffer.py --help`). Each one first puts the repository root on
`sys.path`, so it imports sr1's packages and its sibling scripts the same way whether it runs as a program or is
imported by a test: `from scripts.bench.learner_baselines import SHAPES`. Nothing of the product imports a script
(scripts/check_layers.py keeps it so).
"""
