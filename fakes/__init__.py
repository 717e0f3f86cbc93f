"""Stand-ins and synthetic data that the tests and the benchmarks (scripts/) share: prompts and groups, corpora, a
retrieval server run as a process, a weight-sync receiver without vLLM, engines with the weight-sync extension, a
null vLLM engine core, a fault-injecting TCP proxy.

Each speaks the real part's wire format or runs the real part's code (docs/contributing.md, "What the tests fake"),
so a benchmark that uses one measures the real thing around it. They live here, not in tests/, because a script
never imports the test suite; they are not in the product either: nothing below this package may import it
(scripts/check_layers.py puts it right under scripts/, above every package of sr1), and pyproject.toml does not
install it. The doubles only the tests use stay in tests/fakes/.
"""
