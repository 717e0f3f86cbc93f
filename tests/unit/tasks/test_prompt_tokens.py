"""Prompts longer than model.max_prompt_tokens are dropped when the data is loaded (counted, with example ids), or
refused when dropping is off."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from tasks import DataError, build_task
from tasks.prompt_tokens import encode_prompt, load_fitting_prompts
from tasks.search_r1.protocol import make_prompt_text
from tasks.settings import SearchR1Config


def _padded_parquet(path, n: int = 12, every: int = 4):
    """Search-R1 rows whose every `every`-th question is padded far beyond any context."""
    rows = []
    for i in range(n):
        question = f"who founded alpha {i}" + (" bravo cedar delta" * 3000 if i % every == 0 else "")
        rows.append(
            {
                "data_source": "nq",
                "prompt": [{"role": "user", "content": make_prompt_text(question)}],
                "reward_model": {"style": "rule", "ground_truth": {"target": ["cedar"]}},
                "extra_info": {"split": "train", "index": i},
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _load(path, tokenizer, drop: bool):
    return load_fitting_prompts(
        build_task(SearchR1Config()),
        [path],
        split="train",
        tokenizer=tokenizer,
        max_tokens=512,
        chat_template=False,
        drop_overlong=drop,
    )


def test_overlong_prompts_are_dropped_counted_and_named(tmp_path, tokenizer):
    prompts, overlong = _load(_padded_parquet(tmp_path / "train.parquet"), tokenizer, drop=True)
    assert [p.index for p in prompts] == [1, 2, 3, 5, 6, 7, 9, 10, 11]
    assert (overlong.count, overlong.total) == (3, 12)
    assert [gid.split("/")[2] for gid, _ in overlong.examples] == ["0", "4", "8"]
    assert all(n > 512 for _, n in overlong.examples)
    assert "3 of 12 prompts are longer than model.max_prompt_tokens (512)" in overlong.summary()
    for prompt in prompts:
        assert len(encode_prompt(tokenizer, prompt.prompt, chat_template=False)) <= 512


def test_overlong_prompts_are_refused_when_dropping_is_off(tmp_path, tokenizer):
    with pytest.raises(
        DataError, match=r"train.parquet: 3 of 12 prompts are longer.*filter_overlong_prompts=true"
    ):
        _load(_padded_parquet(tmp_path / "train.parquet"), tokenizer, drop=False)


def test_a_file_of_only_overlong_prompts_is_an_error(tmp_path, tokenizer):
    with pytest.raises(DataError, match="every prompt is too long"):
        _load(_padded_parquet(tmp_path / "train.parquet", n=2, every=1), tokenizer, drop=True)
