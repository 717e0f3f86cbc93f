"""Rewards on a finished trajectory: Search-R1's exact match, token F1, substring EM and the format-aware score.

All of them compare the last `<answer>` of the model's text with the gold answers after Search-R1's normalisation
(lower-case, punctuation and the articles a/an/the removed, whitespace collapsed). `score(...)` returns the
reward chosen by `task.reward` together with every metric, so the learner can log EM whichever reward trains.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

# Search-R1 v0.3 format-aware reward (qa_em_format): the share of the score a well-formed trajectory keeps.
FORMAT_SCORE_WELL_FORMED_WRONG = 0.2
FORMAT_SCORE_MALFORMED_WRONG = 0.1
FORMAT_SCORE_MALFORMED_CORRECT = 0.8

REWARDS = ("em", "f1", "format_em", "substring_em")


def normalize_answer(text: str) -> str:
    """Search-R1 / SQuAD normalisation: lower-case, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(answer: str | None, golds: Sequence[str]) -> float:
    if answer is None:
        return 0.0
    norm = normalize_answer(answer)
    return float(any(norm == normalize_answer(g) for g in golds))


def substring_match(answer: str | None, golds: Sequence[str]) -> float:
    """1 if a normalised gold answer occurs inside the normalised answer (Search-R1's `subem`)."""
    if answer is None:
        return 0.0
    norm = normalize_answer(answer)
    return float(any(normalize_answer(g) in norm for g in golds))


def f1_score(answer: str | None, golds: Sequence[str]) -> float:
    """Token-level F1 between the normalised answer and the best-matching gold answer."""
    if answer is None:
        return 0.0
    pred = normalize_answer(answer).split()
    best = 0.0
    for gold in golds:
        ref = normalize_answer(gold).split()
        common = Counter(pred) & Counter(ref)
        same = sum(common.values())
        if same == 0:
            continue
        precision, recall = same / len(pred), same / len(ref)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass
class RewardResult:
    reward: float
    em: float
    f1: float
    substring_em: float


def score(
    answer: str | None, golds: Sequence[str], *, kind: str = "em", well_formed: bool = True
) -> RewardResult:
    """The reward `kind` of one trajectory plus EM/F1/substring EM as metrics.

    `format_em` follows Search-R1 v0.3: 1 correct and well-formed, 0.8 correct but malformed, 0.2 wrong but
    well-formed, 0.1 wrong and malformed with an answer, 0 with no answer at all.
    """
    if kind not in REWARDS:
        raise ValueError(f"unknown reward {kind!r}; expected one of {', '.join(REWARDS)}")
    golds = [str(g) for g in golds]
    em = exact_match(answer, golds)
    f1 = f1_score(answer, golds)
    sub = substring_match(answer, golds)
    if kind == "em":
        reward = em
    elif kind == "f1":
        reward = f1
    elif kind == "substring_em":
        reward = sub
    elif answer is None:
        reward = 0.0
    elif em:
        reward = 1.0 if well_formed else FORMAT_SCORE_MALFORMED_CORRECT
    else:
        reward = FORMAT_SCORE_WELL_FORMED_WRONG if well_formed else FORMAT_SCORE_MALFORMED_WRONG
    return RewardResult(reward=float(reward), em=em, f1=f1, substring_em=sub)
