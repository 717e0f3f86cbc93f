"""scripts/chaos/chaos_checkpoints.py: the tear cuts what a dying node leaves cut, and the checks of the run name every
expectation it missed (the run itself: tests/integration/test_chaos.py)."""

from __future__ import annotations

import argparse

import pytest


@pytest.fixture(scope="module")
def checkpoints():
    from scripts.chaos import chaos_checkpoints

    return chaos_checkpoints


def test_a_tear_halves_every_file_over_4_kb_and_leaves_the_small_ones(checkpoints, tmp_path):
    step = tmp_path / "step_4"
    (step / "resume").mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"w" * 10_001)
    (step / "resume" / "rng_rank0.pt").write_bytes(b"r" * 8192)
    (step / "config.json").write_text("{}")
    assert checkpoints.tear(step) == ["model.safetensors", "resume/rng_rank0.pt"]
    assert (step / "model.safetensors").stat().st_size == 5000
    assert (step / "resume" / "rng_rank0.pt").stat().st_size == 4096
    assert (step / "config.json").read_text() == "{}"


def _faults(checkpoints, **changes):
    expected = dict(
        torn="step_4",
        skipped=["step_4: model.safetensors has 5000 bytes, the manifest says 10001 (cut short)"],
        fell_back_to=2,
        stop_code=74,
        stop_message="learner: 2 checkpoints in a row could not be written (step 6, step 8): ... needs about 10 MB",
        failed_in_a_row=2,
        left_after_stop=["latest", "step_2", "step_4"],
    )
    return checkpoints.CheckpointFaults(**(expected | changes))


def test_a_run_that_did_what_it_should_misses_nothing(checkpoints):
    assert _faults(checkpoints).missing(every=2) == []


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"skipped": []}, "the resume did not skip step_4"),
        ({"fell_back_to": 4}, "the resume loaded step_4, not step_2"),
        ({"stop_code": 1}, "sr1 run exited with 1, not 74"),
        ({"stop_message": "learner: No space left on device"}, "no space needed in the stop message"),
        ({"left_after_stop": ["latest", "step_2", "step_4", ".step_6.partial"]}, "after the stop"),
        ({"failed_in_a_row": 1}, "checkpoint/failed_in_a_row peaked at 1, not 2"),
    ],
)
def test_each_missed_expectation_is_named(checkpoints, changes, problem):
    (missing,) = _faults(checkpoints, **changes).missing(every=2)
    assert problem in missing


def test_the_option_takes_the_checkpoint_interval(checkpoints):
    parser = argparse.ArgumentParser()
    checkpoints.add_arguments(parser)
    assert parser.parse_args([]).checkpoint_faults is None
    assert parser.parse_args(["--checkpoint-faults"]).checkpoint_faults == 2
    assert parser.parse_args(["--checkpoint-faults", "4"]).checkpoint_faults == 4
