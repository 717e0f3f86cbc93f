"""`sr1 eval`'s own parts: the per-source table, its markdown, and one-line errors for bad input."""

from __future__ import annotations

from sr1.evaluate import main, markdown, per_source_table


def _item(source: str, em: float, reason: str = "answer", calls: int = 1) -> dict:
    return {
        "data_source": source,
        "finish_reason": reason,
        "tool_calls": calls,
        "turns": calls + 1,
        "metrics": {"em": em},
    }


def test_the_table_has_a_row_per_source_and_one_for_all():
    items = [_item("nq", 1.0), _item("nq", 0.0, "budget", 2), _item("hotpotqa", 1.0)]
    summary = {"eval/em": 2 / 3, "eval/em/nq": 0.5, "eval/em/hotpotqa": 1.0, "eval/f1": 0.7}
    rows = per_source_table(items, summary)
    assert [r["source"] for r in rows] == ["hotpotqa", "nq", "all"]
    nq = rows[1]
    assert (nq["n"], nq["em"], nq["searches"], nq["turns"]) == (2, 0.5, 1.5, 2.5)
    assert nq["finish"] == "answer 50%, budget 50%" and rows[2]["f1"] == 0.7 and nq["f1"] is None
    md = markdown(rows, {"checkpoint": "ckpt", "mode": "search"})
    assert "| nq | 2 | 0.500 | - | 1.50 | 2.50 | answer 50%, budget 50% |" in md and "- mode: search" in md


def test_bad_input_is_one_line_naming_it(tmp_path, capsys):
    assert main(["--run-dir", str(tmp_path)]) == 2
    assert "has no complete checkpoint" in capsys.readouterr().err
    model = tmp_path / "model"
    model.mkdir()
    assert main(["--checkpoint", str(model), "--test-files", str(tmp_path / "missing.parquet")]) == 2
    assert "test file(s) not found" in capsys.readouterr().err
    assert main(["--checkpoint", "not/cached-model-xyz", "--test-files", "x"]) == 2
    assert "--checkpoint 'not/cached-model-xyz' is not a directory and not in the Hugging Face cache" in (
        capsys.readouterr().err
    )
