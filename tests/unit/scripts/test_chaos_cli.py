"""scripts/chaos/chaos.py's command line: each kind of fault is run by its own module (chaos_checkpoints, chaos_faults,
chaos_network, chaos_freeze), and a name none of them knows is refused before any run starts."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--parts", "learner,router"], "unknown part(s) ['router']"),
        (["--faults", "poison-prompt,flood"], "unknown fault(s) ['flood']"),
        (["--network", "cut-everything"], "unknown network fault(s) ['cut-everything']"),
        (["--freeze", "generator,gpu"], "unknown part(s) ['gpu']"),
        (["--freeze", "--freeze-for", "5,forever"], "a freeze lasts a number of seconds"),
    ],
)
def test_an_unknown_name_is_a_usage_error_that_names_it(argv, named, capsys, tmp_path):
    from scripts.chaos.chaos import main

    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2 and named in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no run was started


def test_every_fault_kind_adds_its_options_and_runs_from_its_own_module(monkeypatch, tmp_path):
    """`--faults` goes to chaos_faults.chaos_main with the options it added; the kill table does not run."""
    from scripts.chaos import chaos, chaos_faults

    seen = {}

    def faults_main(args, parser):
        seen["args"] = args
        return 3

    monkeypatch.setattr(chaos_faults, "chaos_main", faults_main)
    monkeypatch.setattr(chaos, "run_chaos", lambda *a, **k: pytest.fail("the kills ran"))
    assert chaos.main(["--faults", "retriever-down", "--retriever-down-s", "5", "--out", str(tmp_path)]) == 3
    assert seen["args"].faults == "retriever-down" and seen["args"].retriever_down_s == 5.0


def test_freeze_durations_name_the_lease_and_the_collective_timeout():
    from scripts.chaos import chaos_freeze

    assert chaos_freeze.freeze_seconds("lease") > chaos_freeze.LEASE_S
    assert chaos_freeze.freeze_seconds("timeout") > chaos_freeze.COLLECTIVE_TIMEOUT_S
    assert chaos_freeze.freeze_seconds("2.5") == 2.5
    for bad in ("forever", "0", "-3", "7200"):
        with pytest.raises(ValueError, match="freeze lasts"):
            chaos_freeze.freeze_seconds(bad)


def test_the_preset_reaches_the_run_under_test(monkeypatch, tmp_path):
    """`--preset tiny-lora` puts the LoRA preset under the kills (and the freezes): the `sr1 run` started trains it."""
    import subprocess

    from scripts.chaos import base, chaos

    started = []

    class Stop(Exception):
        pass

    def popen(cmd, **kwargs):
        started.append(cmd)
        raise Stop

    monkeypatch.setattr(subprocess, "Popen", popen)
    for argv, preset in (([], "tiny"), (["--preset", "tiny-lora"], "tiny-lora")):
        with pytest.raises(Stop):
            chaos.main(["--parts", "learner", "--out", str(tmp_path), *argv])
        assert started[-1][3:5] == ["run", preset], started[-1]
    with pytest.raises(Stop):
        base.ChaosRun(tmp_path / "freeze", [], preset="tiny-lora")
    assert started[-1][4] == "tiny-lora"


def test_learner_restarts_are_counted_from_the_supervisor_and_laid_to_the_freeze_they_came_in(tmp_path):
    """A restart during the Redis freeze fails the audit even when a learner rank is frozen later in the same run;
    a learner that dies before it reaches Redis (no line in learner_groups.jsonl) still counts."""
    from types import SimpleNamespace

    from scripts.chaos import chaos_freeze
    from scripts.chaos.base import Verdict

    log = tmp_path / "run-0.log"
    log.write_text(
        "restarted learner-0 (pid 11)\n[  185s] restarted learner-0 (it died; see x)\n"
        "learner-1 is restarted with learner-0\nrestarted learner-0 (pid 12)\nrestarted generator-0 (pid 13)\n"
    )
    chaos = SimpleNamespace(launches=1, log_path=lambda launch: log)
    assert chaos_freeze.learner_restarts_so_far(chaos) == 2

    verdict = Verdict(True, 20, 0, 0, True, 2, 2, [])
    freezes = [("redis", 50.0), ("learner", 50.0)]
    during_redis = chaos_freeze.FreezeVerdict(freezes, verdict, [2, 1])
    assert during_redis.learner_restarts == 3 and not during_redis.ok
    assert "| 3 (redis 2, learner 1) |" in chaos_freeze.table([during_redis])
    only_the_learner = chaos_freeze.FreezeVerdict(freezes, verdict, [0, 1])
    assert only_the_learner.ok and "| 1 (learner 1) |" in chaos_freeze.table([only_the_learner])
