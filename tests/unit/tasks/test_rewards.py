"""Search-R1's answer normalisation, EM, F1, substring EM and the format-aware score."""

from __future__ import annotations

import pytest

from tasks.search_r1.protocol import extract_answer, is_well_formed_turn, parse_action
from tasks.search_r1.rewards import exact_match, f1_score, normalize_answer, score, substring_match


def test_normalisation_drops_case_punctuation_articles_and_spaces():
    assert normalize_answer("  The  Beatles!! ") == "beatles"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match_any_gold_and_none():
    assert exact_match("the Eiffel tower", ["Eiffel Tower", "x"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match(None, ["a"]) == 0.0
    assert substring_match("it is the Eiffel Tower in Paris", ["eiffel tower"]) == 1.0


def test_f1_takes_the_best_gold():
    assert f1_score("barack obama", ["obama", "george bush"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("paris", ["Paris"]) == 1.0
    assert f1_score("london", ["paris"]) == 0.0


def test_last_answer_counts_and_actions_parse():
    assert extract_answer("<answer> a </answer> then <answer> b </answer>") == "b"
    assert extract_answer("no answer") is None
    assert parse_action("<think> x </think> <search>  who  </search>") == ("search", "who")
    assert parse_action("<think> x </think> <answer>Paris</answer>") == ("answer", "Paris")
    assert parse_action("<search> x </answer>") == (None, "")
    assert is_well_formed_turn("<think> a </think>\n<answer> b </answer>")
    assert not is_well_formed_turn("<answer> b </answer>")
    assert not is_well_formed_turn("<think> a </think> <answer> b </answer> extra")


@pytest.mark.parametrize(
    ("answer", "well_formed", "expected"),
    [
        ("Paris", True, 1.0),
        ("Paris", False, 0.8),
        ("Rome", True, 0.2),
        ("Rome", False, 0.1),
        (None, False, 0.0),
    ],
)
def test_format_aware_score(answer, well_formed, expected):
    assert score(answer, ["paris"], kind="format_em", well_formed=well_formed).reward == expected


def test_score_reports_every_metric_and_rejects_unknown_kinds():
    result = score("the paris", ["Paris"], kind="f1")
    assert (result.reward, result.em, result.f1, result.substring_em) == (1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="unknown reward 'bleu'"):
        score("x", ["x"], kind="bleu")
