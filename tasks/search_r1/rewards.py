"""Rewards on a finished trajectory: Search-R1's exact match, token F1, substring EM and the format-aware score.

All of them compare the last `<answer>` of the model's text with the gold answers after Search-R1's normalisation
(lower-case, punctuation and the articles a/an/the removed, whitespace collapsed). `score(...)` returns the
reward chosen by `task.reward` together with every metric, so the learner can log EM whichever reward trains.

The format-aware score (`format_em`, Search-R1 v0.3's `qa_em_format`) has three weights, named as Search-R1 names them
and set in `task.*` (`FormatWeights`): `structure_format_score` (a well-formed trajectory with a wrong answer; a
correct but malformed one gets 1 minus it), `final_format_score` (a malformed one with a wrong answer) and
`retrieval_score` (added to a well-formed wrong answer when a gold answer appears in the retrieved information).
`task.reward_function` replaces the reward by a function of your own (tasks/search_r1/__init__.py).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

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


@dataclass(frozen=True)
class FormatWeights:
    """The format-aware score's weights; the defaults are Search-R1 v0.3's training scripts' (0.2, 0.1, 0)."""

    structure_format_score: float = 0.2
    final_format_score: float = 0.1
    retrieval_score: float = 0.0


def retrieval_correct(observations: Sequence[str], golds: Sequence[str]) -> bool:
    """Whether a normalised gold answer occurs in a retrieved `<information>` block (Search-R1's check)."""
    blocks = [normalize_answer(o) for o in observations if "<information>" in o]
    return any(normalize_answer(g) in block for g in golds for block in blocks)


@dataclass
class RewardResult:
    reward: float
    em: float
    f1: float
    substring_em: float


def score(
    answer: str | None,
    golds: Sequence[str],
    *,
    kind: str = "em",
    well_formed: bool = True,
    weights: FormatWeights = FormatWeights(),
    found_in_retrieval: bool = False,
) -> RewardResult:
    """The reward `kind` of one trajectory plus EM/F1/substring EM as metrics.

    `format_em` follows Search-R1 v0.3 (default weights): 1 correct and well-formed, 1 - structure_format_score
    (0.8) correct but malformed, structure_format_score (0.2) wrong but well-formed, plus retrieval_score (0) when a
    gold answer was in the retrieved information (`found_in_retrieval`), final_format_score (0.1) wrong and malformed
    with an answer, 0 with no answer at all.
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
        reward = 1.0 if well_formed else 1.0 - weights.structure_format_score
    elif well_formed:
        reward = weights.structure_format_score + (weights.retrieval_score if found_in_retrieval else 0.0)
    else:
        reward = weights.final_format_score
    return RewardResult(reward=float(reward), em=em, f1=f1, substring_em=sub)
