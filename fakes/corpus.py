"""Generated corpora for the tests and the retrieval benchmark (no downloads).

`synthetic_records(n)` makes n wiki-style passages about invented entities (a title plus three facts built from
word lists), deterministic for a seed; `synthetic_queries(records, m)` asks about facts of random passages.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_SYL = [
    "ka",
    "lo",
    "mer",
    "vin",
    "tha",
    "zor",
    "quel",
    "dra",
    "pen",
    "sil",
    "mor",
    "ga",
    "rin",
    "tu",
    "bel",
    "os",
]
_KINDS = ["river", "mountain", "poet", "chemist", "city", "festival", "ship", "painter", "island", "composer"]
_PLACES = [
    "Norvale",
    "Estria",
    "Kambor",
    "Ulvenheim",
    "Sarnok",
    "Peldria",
    "Tavros",
    "Quorin",
    "Brisca",
    "Lumen",
]
_FACTS = [
    "It was first recorded in the year {year}.",
    "Its best known feature is the {adj} {noun}.",
    "Local legends link it to the {adj} {noun} of {place}.",
    "Scholars from {place} studied it for {num} years.",
    "It appears on {num} maps drawn before {year}.",
]
_ADJ = ["silver", "ancient", "northern", "crimson", "hidden", "golden", "quiet", "broken", "tall", "frozen"]
_NOUN = [
    "bridge",
    "tower",
    "garden",
    "harbor",
    "library",
    "forest",
    "temple",
    "market",
    "valley",
    "lighthouse",
]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYL) for _ in range(rng.randint(2, 3))).capitalize()


def synthetic_records(n: int, seed: int = 0) -> Iterator[dict[str, str]]:
    """n passages `{"id", "title", "text"}` about invented entities."""
    rng = random.Random(seed)
    for i in range(n):
        title = f"{_name(rng)} {_name(rng)}"
        kind, place = rng.choice(_KINDS), rng.choice(_PLACES)
        facts = [
            f.format(
                year=rng.randint(1000, 2000),
                adj=rng.choice(_ADJ),
                noun=rng.choice(_NOUN),
                place=rng.choice(_PLACES),
                num=rng.randint(2, 90),
            )
            for f in rng.sample(_FACTS, 3)
        ]
        yield {"id": str(i), "title": title, "text": f"{title} is a {kind} in {place}. " + " ".join(facts)}


def synthetic_queries(records: list[dict[str, str]], m: int, seed: int = 1) -> list[str]:
    """m questions, each about a random passage (its title and one of its words), all distinct."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < m:
        rec = rng.choice(records)
        words = [w.strip(".") for w in rec["text"].split() if len(w) > 4]
        q = f"what is {rec['title']} known for {rng.choice(words)} {len(out)}"
        if q not in seen:
            seen.add(q)
            out.append(q)
    return out
