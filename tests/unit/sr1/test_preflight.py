"""Data and config are checked before any pool starts, one line per problem, and a process stopped by them exits with
EXIT_BAD_INPUT (which supervisors do not restart)."""

from __future__ import annotations

import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from config import EXIT_BAD_INPUT, load_config
from sr1.preflight import BadInput, check_inputs


def _rows(n: int, empty_gold_at: int | None = None, padded_at: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        question = f"who founded alpha {i}" + (" bravo cedar" * 4000 if i == padded_at else "")
        rows.append(
            {
                "data_source": "nq",
                "prompt": [{"role": "user", "content": f"Question: {question}"}],
                "reward_model": {
                    "style": "rule",
                    "ground_truth": {"target": [] if i == empty_gold_at else ["cedar"]},
                },
                "extra_info": {"split": "train", "index": i},
            }
        )
    return rows


@pytest.fixture
def files(tmp_path):
    good, empty_gold, padded = (
        tmp_path / "good.parquet",
        tmp_path / "empty_gold.parquet",
        tmp_path / "long.parquet",
    )
    pq.write_table(pa.Table.from_pylist(_rows(8)), good)
    pq.write_table(pa.Table.from_pylist(_rows(8, empty_gold_at=7)), empty_gold)
    pq.write_table(pa.Table.from_pylist(_rows(8, padded_at=3)), padded)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(good.read_bytes()[:100])
    return {"good": good, "empty_gold": empty_gold, "padded": padded, "corrupt": corrupt}


def _cfg(tiny_model_dir, train, test=(), *extra):
    return load_config(
        "tiny",
        [
            f"model.path={tiny_model_dir}",
            f"data.train_files=[{', '.join(map(str, train))}]",
            f"data.test_files=[{', '.join(map(str, test))}]",
            *extra,
        ],
    )


def test_every_problem_is_one_line_naming_file_and_row(tiny_model_dir, files):
    cfg = _cfg(tiny_model_dir, [files["good"], files["empty_gold"]], [files["corrupt"]])
    with pytest.raises(BadInput) as err:
        check_inputs(cfg)
    assert len(err.value.problems) == 2
    assert "empty_gold.parquet row 7: the list of gold answers is empty" in err.value.problems[0]
    assert "corrupt.parquet: not a readable parquet file" in err.value.problems[1]
    assert all("\n" not in p for p in err.value.problems)


def test_overlong_prompts_are_reported_or_refused(tiny_model_dir, files):
    notes = check_inputs(_cfg(tiny_model_dir, [files["padded"]]))
    assert len(notes) == 1 and "1 of 8 prompts are longer" in notes[0] and "nq/train/3/" in notes[0]
    with pytest.raises(BadInput, match="long.parquet: 1 of 8 prompts are longer"):
        check_inputs(_cfg(tiny_model_dir, [files["padded"]], (), "data.filter_overlong_prompts=false"))


def test_a_missing_model_is_named(files):
    with pytest.raises(BadInput, match="model.path '/nowhere/model' is not a directory"):
        check_inputs(
            load_config("tiny", ["model.path=/nowhere/model", f"data.train_files=[{files['good']}]"])
        )


@pytest.fixture
def keep_sigterm():
    previous = signal.getsignal(signal.SIGTERM)  # `sr1 run` turns SIGTERM into Ctrl-C for itself
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sr1_run_stops_before_redis_with_the_bad_input_status(
    tiny_model_dir, files, tmp_path, capsys, keep_sigterm
):
    from sr1.run import main

    run_dir = tmp_path / "run"
    argv = [
        f"model.path={tiny_model_dir}",
        f"data.train_files=[{files['empty_gold']}]",
        "learner.max_staleness=0",
        "--run-dir",
        str(run_dir),
        "--no-live",
    ]
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"sr1 run: {files['empty_gold']} row 7: the list of gold answers is empty"
    ]
    assert not (run_dir / "redis").exists() and not (run_dir / "logs").exists()  # nothing was started


def test_sr1_run_refuses_a_boolean_number_with_the_bad_input_status(capsys, keep_sigterm):
    from sr1.run import main

    assert main(["learner.max_staleness=true", "--no-live"]) == EXIT_BAD_INPUT
    assert "learner.max_staleness: expected a number, got the boolean True" in capsys.readouterr().err


def test_the_learner_process_exits_with_the_bad_input_status(
    tiny_model_dir, files, tmp_path, capsys, monkeypatch
):
    from sr1.entrypoints.learner import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # restored after the test, whatever main sets

    argv = [
        "--config",
        "tiny",
        f"model.path={tiny_model_dir}",
        f"data.train_files=[{files['empty_gold']}]",
        f"run_dir={tmp_path}",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    ]
    assert main(argv) == EXIT_BAD_INPUT  # before Redis or torch.distributed: that URL answers nothing
    assert "empty_gold.parquet row 7: the list of gold answers is empty" in capsys.readouterr().err


def test_the_generator_process_exits_with_the_bad_input_status(
    tiny_model_dir, files, tmp_path, capsys, monkeypatch
):
    from generators.engine import DIE_WITH_PARENT_ENV
    from sr1.entrypoints.generators import main

    monkeypatch.delenv(DIE_WITH_PARENT_ENV, raising=False)  # restored after the test, whatever main sets

    argv = [
        "--config",
        "tiny",
        f"model.path={tiny_model_dir}",
        f"data.test_files=[{files['corrupt']}]",
        f"run_dir={tmp_path}",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    ]
    assert main(argv) == EXIT_BAD_INPUT  # before its engine starts
    assert "corrupt.parquet: not a readable parquet file" in capsys.readouterr().err


def test_a_generator_with_a_missing_model_exits_with_the_bad_input_status(tmp_path, capsys):
    from sr1.entrypoints.generators import main

    missing = tmp_path / "no-such-model"
    argv = [
        "--config",
        "tiny",
        f"model.path={missing}",
        f"run_dir={tmp_path}",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    ]
    assert main(argv) == EXIT_BAD_INPUT  # before its engine starts, and before any restart would help
    assert str(missing) in capsys.readouterr().err
