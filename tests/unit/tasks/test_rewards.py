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


def test_format_weights_are_the_configs_and_search_r1s():
    from tasks.search_r1.rewards import FormatWeights
    from tasks.settings import SearchR1Config

    cfg = SearchR1Config()
    assert FormatWeights() == FormatWeights(
        cfg.structure_format_score, cfg.final_format_score, cfg.retrieval_score
    )
    weights = FormatWeights(structure_format_score=0.3, final_format_score=0.05, retrieval_score=0.1)
    assert score(
        "Paris", ["paris"], kind="format_em", well_formed=False, weights=weights
    ).reward == pytest.approx(0.7)
    assert score("Rome", ["paris"], kind="format_em", well_formed=False, weights=weights).reward == 0.05
    wrong = score(
        "Rome", ["paris"], kind="format_em", well_formed=True, weights=weights, found_in_retrieval=True
    )
    assert wrong.reward == pytest.approx(0.4)  # structure + retrieval
    assert score(
        "Rome", ["paris"], kind="format_em", well_formed=True, weights=weights
    ).reward == pytest.approx(0.3)


def _rollout(turns: list[str], observations: list[str]):
    from generators.agent import Rollout

    return Rollout(prompt_ids=[1], turn_texts=turns, finish_reason="answer", observations=observations)


def test_retrieval_score_needs_the_gold_answer_in_retrieved_information():
    from tasks.search_r1 import SearchR1Task
    from tasks.search_r1.rewards import retrieval_correct
    from tasks.settings import SearchR1Config

    found = '\n\n<information>Doc 1(Title: "France") The capital is Paris.</information>\n\n'
    assert retrieval_correct([found], ["paris"]) and not retrieval_correct(
        ["Paris, invalid action"], ["paris"]
    )
    task = SearchR1Task(SearchR1Config(reward="format_em", retrieval_score=0.1))
    turns = ["<think> a </think> <search> capital </search>", "<think> b </think> <answer> Rome </answer>"]
    assert task.score(_rollout(turns, [found]), ["Paris"]).reward == pytest.approx(0.3)
    assert (
        task.score(_rollout(turns, ["\n\n<information>nothing</information>\n\n"]), ["Paris"]).reward == 0.2
    )


def length_reward(transcript, ground_truth) -> float:
    """A reward of one's own for the hook test: the number of turns, plus one per gold answer."""
    return float(len(transcript.turn_texts) + len(ground_truth))


def test_reward_function_by_import_path_replaces_the_reward():
    from config import ConfigError, load_config
    from tasks.search_r1 import SearchR1Task
    from tasks.settings import SearchR1Config

    task = SearchR1Task(SearchR1Config(reward_function=f"{__name__}:length_reward"))
    scored = task.score(
        _rollout(["<think> a </think> <answer> Paris </answer>"], []), ["Paris", "paris city"]
    )
    assert scored.reward == 3.0 and scored.metrics["em"] == 1.0  # EM still reported
    with pytest.raises(ValueError, match="task.reward_function 'tasks.nowhere:f' cannot be imported"):
        SearchR1Task(SearchR1Config(reward_function="tasks.nowhere:f"))
    with pytest.raises(ConfigError, match="package.module:function"):
        load_config("tiny", ["task.reward_function=not-a-path"])
