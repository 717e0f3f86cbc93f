"""The tiny world's knowledge base: fictional people with random facts, the passages stating them, the questions.

Everything is drawn from one seed. Names are random syllables (first names are shared by several people, full names
are unique); each person has a birthplace city, an occupation and an instrument drawn at random, so no model can
know them without searching. The corpus is Search-R1's wiki-18 JSONL (`{"id", "contents": "\\"Title\\"\\ntext"}`),
one short passage per fact titled with the person's name plus background passages about the cities; the questions
are Search-R1's parquet layout (`train.parquet` / `test.parquet`), one per (person, attribute), with the task's
prompt, answerable only by copying the attribute from the right passage.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.search_r1.protocol import make_prompt_messages

DATA_SOURCE = "tinykb"

_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "th",
    "sh",
    "gr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "k", "th", "m"]

OCCUPATIONS = [
    "baker", "weaver", "potter", "sailor", "miner", "scribe", "healer", "mason", "tailor", "hunter", "brewer",
    "farmer", "painter", "singer", "smith", "carpenter", "fisher", "merchant", "teacher", "glassblower",
]  # fmt: skip


INSTRUMENTS = [
    "lute", "harp", "flute", "drum", "fiddle", "horn", "viol", "zither", "oboe", "cello", "lyre", "organ",
    "trumpet", "banjo", "sitar", "tuba", "bell", "pipe", "guitar", "piano",
]  # fmt: skip


@dataclass(frozen=True)
class Attribute:
    """One kind of fact: how it is asked, how the passage states it, the keyword a good query uses."""

    key: str
    question: str  # format with name
    passage: str  # format with value (the title names the person)
    keyword: str  # the attribute word of a query
    think: str  # the warm-start reasoning before searching


ATTRIBUTES = [
    Attribute("birthplace", "Which city was the birthplace of {name}?", "Born in the city of {value}.", "born",
              "I need the birthplace, so I will search for it."),
    Attribute("occupation", "What was the occupation of {name}?", "By occupation a {value}.",
              "occupation", "I need the occupation, so I will search for it."),
    Attribute("instrument", "Which instrument was played by {name}?", "Played the {value} as an instrument.",
              "instrument", "I need the instrument, so I will search for it."),
]  # fmt: skip
ATTRIBUTE_BY_KEY = {a.key: a for a in ATTRIBUTES}


@dataclass(frozen=True)
class WorldSizes:
    """The size of the world; all defaults are what `sr1 run` uses."""

    num_people: int = 300
    num_first_names: int = 60  # each first name is shared by ~num_people/num_first_names people
    num_last_names: int = 80
    num_cities: int = 40
    num_test: int = 100
    num_warmstart: int = 2000  # supervised trajectories
    good_query_share: float = 0.3  # share of warm-start trajectories that search with the full name
    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 256
    warmstart_epochs: int = 20
    warmstart_lr: float = 2e-3
    warmstart_batch: int = 16
    # start with an output layer equal to the embeddings and an identity OV circuit in the last layer
    # (sr1.warmstart.copy_friendly_init); off by default: on seed 0 it gave a higher loss after one epoch
    copy_init: bool = False
    # the warm start's forward through world/lean.py (the last layer only where a loss token is predicted): 15-20 %
    # less CPU per step, other rounding; off by default: its build of seed 0 sampled the full-name query on 0.06 of
    # the questions (0.18 with transformers' forward) and left RL less to learn (docs/tiny-world.md)
    lean_forward: bool = False

    @property
    def model_shape(self) -> dict[str, int]:
        """The policy's shape, as `world.model.build_model` takes it."""
        fields = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
        return {field: getattr(self, field) for field in fields}


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    facts: dict[str, str]

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    person: int | None  # index into people, None for background passages
    attribute: str | None

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class Question:
    person: int
    attribute: str
    question: str
    answer: str
    split: str
    index: int


@dataclass
class KnowledgeBase:
    seed: int
    people: list[Person]
    cities: list[str]
    passages: list[Passage]
    train: list[Question]
    test: list[Question]

    def good_query(self, q: Question) -> str:
        """The query that retrieves the right passage first: full name plus the attribute keyword."""
        return f"{self.people[q.person].name} {ATTRIBUTE_BY_KEY[q.attribute].keyword}"

    def passage(self, doc_id: str) -> Passage:
        """The passage a corpus document id names (the search index answers with ids and contents)."""
        return self.passages[int(doc_id)]  # ids are the passages' positions, assigned after the shuffle

    def imperfect_query(self, q: Question) -> str:
        """The query most warm-start trajectories use: first name only, so a namesake's passage may come first."""
        return f"{self.people[q.person].first} {ATTRIBUTE_BY_KEY[q.attribute].keyword}"


def _words(rng: random.Random, count: int, syllables: tuple[int, int], taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        n = rng.randint(*syllables)
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n)) + rng.choice(_CODAS)
        word = word.capitalize()
        if len(word) < 4 or word.lower() in taken:
            continue
        taken.add(word.lower())
        out.append(word)
    return out


def build_kb(seed: int = 0, sizes: WorldSizes | None = None) -> KnowledgeBase:
    """The deterministic knowledge base, corpus passages and train/test questions for `seed`."""
    sizes = sizes or WorldSizes()
    if sizes.num_people > sizes.num_first_names * sizes.num_last_names:
        raise ValueError(
            f"num_people ({sizes.num_people}) exceeds the number of distinct full names "
            f"({sizes.num_first_names} x {sizes.num_last_names})"
        )
    rng = random.Random(f"tinykb-{seed}")
    taken = {w.lower() for w in OCCUPATIONS + INSTRUMENTS} | {"born", "city", "occupation", "instrument"}
    firsts = _words(rng, sizes.num_first_names, (2, 3), taken)
    lasts = _words(rng, sizes.num_last_names, (1, 2), taken)
    cities = _words(rng, sizes.num_cities, (2, 3), taken)

    # every first name is used by about the same number of people, so a first-name query is ambiguous
    names: set[tuple[str, str]] = set()
    people: list[Person] = []
    while len(people) < sizes.num_people:
        first = firsts[len(people) % len(firsts)]
        last = rng.choice(lasts)
        if (first, last) in names:
            continue
        names.add((first, last))
        facts = {
            "birthplace": rng.choice(cities),
            "occupation": rng.choice(OCCUPATIONS),
            "instrument": rng.choice(INSTRUMENTS),
        }
        people.append(Person(first, last, facts))
    rng.shuffle(people)

    passages: list[Passage] = []
    for i, person in enumerate(people):
        for attr in ATTRIBUTES:
            text = attr.passage.format(value=person.facts[attr.key])
            passages.append(Passage(str(len(passages)), person.name, text, i, attr.key))
    for city in cities:
        river = rng.choice(lasts)
        text = f"{city} is an old city on the river {river}, known for its markets and bridges."
        passages.append(Passage(str(len(passages)), city, text, None, None))
    order = list(range(len(passages)))
    rng.shuffle(order)
    passages = [dataclasses.replace(passages[j], id=str(k)) for k, j in enumerate(order)]

    pairs = [(i, a.key) for i in range(len(people)) for a in ATTRIBUTES]
    rng.shuffle(pairs)
    if sizes.num_test >= len(pairs):
        raise ValueError(f"num_test ({sizes.num_test}) must be below the number of facts ({len(pairs)})")
    questions = []
    for k, (i, key) in enumerate(pairs):
        split = "test" if k < sizes.num_test else "train"
        attr = ATTRIBUTE_BY_KEY[key]
        index = k if split == "test" else k - sizes.num_test
        text = attr.question.format(name=people[i].name)
        questions.append(Question(i, key, text, people[i].facts[key], split, index))
    return KnowledgeBase(
        seed=seed,
        people=people,
        cities=cities,
        passages=passages,
        train=[q for q in questions if q.split == "train"],
        test=[q for q in questions if q.split == "test"],
    )


# -- files ------------------------------------------------------------------------------------------------------


def passage_value(passage: Passage, kb: KnowledgeBase) -> str:
    """The attribute value a passage states (what the warm-start answer copies), or its title if it has none."""
    if passage.person is None or passage.attribute is None:
        return passage.title
    return kb.people[passage.person].facts[passage.attribute]


# -- files ------------------------------------------------------------------------------------------------------


def write_corpus(kb: KnowledgeBase, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in kb.passages:
            f.write(json.dumps({"id": p.id, "contents": p.contents}) + "\n")
    return path


def question_rows(questions: list[Question]) -> list[dict[str, Any]]:
    """Rows in Search-R1's parquet layout."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": make_prompt_messages(q.question),
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": [q.answer]}},
            "extra_info": {"split": q.split, "index": q.index},
        }
        for q in questions
    ]


def write_questions(questions: list[Question], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(question_rows(questions)), path)
    return path
