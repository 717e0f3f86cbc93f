"""`sr1 world`: the embedded world a run with the same arguments would use (here only the paths that build nothing)."""

from __future__ import annotations

import pytest

from sr1.embedded import build_embedded
from sr1.run import world_main as main


def test_a_model_that_is_not_embedded_needs_no_world(capsys):
    assert main(["model.path=/models/qwen"]) == 0
    assert "is not embedded: nothing to build" in capsys.readouterr().out


def test_a_bad_override_is_named(capsys):
    assert main(["learner.no_such_field=1"]) == 78  # EXIT_BAD_INPUT, as sr1 run
    assert "no_such_field" in capsys.readouterr().err


def test_only_embedded_models_are_built():
    with pytest.raises(ValueError, match="not an embedded model"):
        build_embedded("/models/qwen", 0)


def test_it_takes_sr1_runs_flags(capsys):
    assert (
        main(["model.path=/models/qwen", "--no-live", "--run-dir", "/tmp/x", "--startup-timeout", "5"]) == 0
    )
    assert "nothing to build" in capsys.readouterr().out


def test_the_sr1_command_dispatches_world(capsys):
    from sr1.cli import main as sr1

    assert sr1(["world", "model.path=/models/qwen"]) == 0
    assert "nothing to build" in capsys.readouterr().out
