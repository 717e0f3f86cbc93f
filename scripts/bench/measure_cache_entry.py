"""What one entry of the retrieval server's result cache holds in memory, measured and as the cache estimates it.

    python scripts/bench/measure_cache_entry.py                  # wiki-18-like passages (100 words), topk 3 and 20
    python scripts/bench/measure_cache_entry.py --words 60 --topk 5 --entries 4000

The passages are generated (Search-R1's wiki-18 splits Wikipedia into 100-word passages) and written as corpus
JSONL; each entry is filled the way the server fills it: a `DocStore.get_many` over the hit rows (fresh dicts per
search) wrapped in `Hits`, put into a `ResultCache` under a distinct query. tracemalloc counts the bytes the cache
holds after `--entries` puts; the estimate is the cache's own `entry_bytes`, which bounds it by
`retrieval.server.cache_mb`. Printed per topk: measured and estimated bytes per entry, their ratio, and how many
entries 256 MiB (the default) holds.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from retrieval.base import Hits  # noqa: E402
from retrieval.cache import ResultCache  # noqa: E402
from retrieval.corpus import DocStore, write_corpus_jsonl  # noqa: E402


def _passages(n: int, words: int, rng: random.Random) -> list[dict[str, str]]:
    vocab = [
        f"{a}{b}" for a in ("ka", "lo", "mer", "vin", "tha", "zor", "quel") for b in ("n", "ra", "tis", "os")
    ]
    vocab += ["the", "of", "and", "in", "was", "a", "to", "is", "by", "for", "with", "as", "on"]
    return [
        {"id": str(i), "title": f"Entity {i}", "text": " ".join(rng.choice(vocab) for _ in range(words))}
        for i in range(n)
    ]


def measure(store: DocStore, topk: int, entries: int, rng: random.Random) -> tuple[float, float]:
    """(measured, estimated) bytes per entry for `entries` cached results of `topk` passages each."""
    rows = len(store)
    cache = ResultCache(max_entries=entries + 1, max_bytes=1 << 40)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(entries):
        docs = store.get_many([rng.randrange(rows) for _ in range(topk)])
        cache.put(
            (f"who founded entity {i} and when did it happen?", topk),
            Hits(docs, [1.0 / (k + 1) for k in range(topk)]),
        )
    measured = (tracemalloc.get_traced_memory()[0] - before) / entries
    tracemalloc.stop()
    return measured, cache.bytes / entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", type=int, default=100, help="words per passage (wiki-18: 100)")
    parser.add_argument("--topk", type=int, nargs="+", default=[3, 20], help="passages per entry")
    parser.add_argument("--entries", type=int, default=2000, help="entries cached per measurement")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        write_corpus_jsonl(path, _passages(5000, args.words, rng))
        store = DocStore(path)
        chars = sum(len(store.get(i)["contents"]) for i in range(100)) / 100
        print(
            f"passages of {args.words} words ({chars:.0f} characters of contents); {args.entries} entries each"
        )
        print(
            f"{'topk':>5} {'measured B/entry':>17} {'estimated B/entry':>18} {'est/measured':>13} {'entries in 256 MiB':>19}"
        )
        for topk in args.topk:
            measured, estimated = measure(store, topk, args.entries, rng)
            per_256 = int((256 << 20) / estimated)
            print(
                f"{topk:>5} {measured:>17.0f} {estimated:>18.0f} {estimated / measured:>13.2f} {per_256:>19,}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
