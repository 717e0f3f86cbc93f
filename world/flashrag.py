"""A CPU rehearsal of Search-R1's real data: the tiny world's questions and corpus in the layouts users download.

    python -m world.flashrag --out data/rehearsal --seed 0
    # data/rehearsal/flashrag/<dataset>/<split>.jsonl   FlashRAG_datasets' layout (id, question, golden_answers, metadata)
    # data/rehearsal/corpus.jsonl                       wiki-18's layout ({"id", "contents": "\"Title\"\\ntext"})

The questions are spread over Search-R1's seven dataset names with the splits each really has there (NQ has train
and test, HotpotQA train and dev, 2WikiMultiHopQA and MuSiQue dev, TriviaQA, PopQA and Bamboogle test), so `sr1 data
prepare` takes the same paths on them as on the downloads: the train file from NQ + HotpotQA train, the test file
from the seven datasets' test-else-dev splits. Only the knowledge is synthetic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tasks.search_r1.prepare import LocalFlashRAG, prepare
from world.kb import KnowledgeBase, Question, WorldSizes, build_kb, write_corpus

TRAIN_SPLITS = (("nq", "train"), ("hotpotqa", "train"))
TEST_SPLITS = (
    ("nq", "test"),
    ("triviaqa", "test"),
    ("popqa", "test"),
    ("hotpotqa", "dev"),
    ("2wikimultihopqa", "dev"),
    ("musique", "dev"),
    ("bamboogle", "test"),
)


def _row(q: Question, kb: KnowledgeBase, split: str, k: int) -> dict:
    return {
        "id": f"{split}_{k}",
        "question": q.question.rstrip("?"),  # FlashRAG's questions often lack the '?'
        "golden_answers": [q.answer],
        "metadata": {"person": kb.people[q.person].name},
    }


def write_flashrag(kb: KnowledgeBase, out_dir: Path) -> dict[str, int]:
    """Write `out_dir/<dataset>/<split>.jsonl` from the world's questions; returns rows per `dataset/split`."""
    counts: dict[str, int] = {}
    for questions, splits in ((kb.train, TRAIN_SPLITS), (kb.test, TEST_SPLITS)):
        for j, (dataset, split) in enumerate(splits):
            mine = questions[j :: len(splits)]  # round robin: every dataset gets its share of every attribute
            path = out_dir / dataset / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with tmp.open("w") as f:
                for k, q in enumerate(mine):
                    f.write(json.dumps(_row(q, kb, split, k)) + "\n")
            tmp.replace(path)
            counts[f"{dataset}/{split}"] = len(mine)
    return counts


def write_rehearsal(out_dir: Path, seed: int = 0, **sizes) -> dict[str, int]:
    """The FlashRAG-shaped questions under `out_dir/flashrag/` and the corpus at `out_dir/corpus.jsonl`."""
    kb = build_kb(seed, WorldSizes(**sizes))
    write_corpus(kb, out_dir / "corpus.jsonl")
    return write_flashrag(kb, out_dir / "flashrag")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m world.flashrag", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    counts = write_rehearsal(args.out, args.seed)
    for name, n in counts.items():
        print(f"{args.out / 'flashrag' / name}.jsonl  {n} questions")
    print(f"{args.out / 'corpus.jsonl'}  (wiki-18 layout)")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def build_rehearsal(out_dir: Path, seed: int = 0) -> tuple[Path, Path, Path]:
    """The rehearsal prepared as a user would (`sr1 data prepare`): (train.parquet, test.parquet, corpus.jsonl),
    cached in `out_dir`."""
    train, test, corpus = out_dir / "train.parquet", out_dir / "test.parquet", out_dir / "corpus.jsonl"
    marker = out_dir / "rehearsal.json"
    wanted = {"seed": seed}
    if marker.is_file() and json.loads(marker.read_text()) == wanted and train.is_file() and test.is_file():
        return train, test, corpus
    write_rehearsal(out_dir, seed)
    prepare(
        LocalFlashRAG(out_dir / "flashrag"),
        out_dir,
        train=[d for d, _ in TRAIN_SPLITS],
        test=[d for d, _ in TEST_SPLITS],
    )
    marker.write_text(json.dumps(wanted) + "\n")
    return train, test, corpus
