"""Search-R1's (verl's) config vocabulary: the key table key by key, overrides through every entry point, whole
training scripts translated to sr1's Search-R1 presets, and the generated document."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config import ConfigError, load_config, load_job
from config.search_r1 import resolve_interpolations, translate
from config.search_r1_keys import IMPLIED, KEYS, verl_defaults
from config.search_r1_script import (
    ScriptError,
    parse_script,
    preset_yaml,
    search_r1_keys_doc,
    translate_script,
)
from learner.job import LearnerJob

SCRIPTS = Path(__file__).parent / "search_r1_scripts"
ROOT = Path(__file__).resolve().parents[3]
PPO, GRPO = "search-r1-ppo-8xh100", "search-r1-grpo-8xh100"


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        nested = isinstance(value, dict) and value
        out |= flat(value, f"{prefix}{key}.") if nested else {f"{prefix}{key}": value}
    return out


def text(value) -> str:
    """A value as an override writes it."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def same(a, b) -> bool:
    return a == pytest.approx(b) if isinstance(b, float) else a == b


def resolved(preset, overrides=()) -> dict:
    return flat(load_config(preset, list(overrides)).model_dump(mode="json"))


def differences(a: dict, b: dict) -> dict:
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


# -- the table, key by key ------------------------------------------------------------------------------------------

RERANK = ["reranker.url=http://h:6980/rerank"]  # what reranking needs beside the switch
# every key that sets sr1 fields: (preset, the override's value, the sr1 fields it must give[, overrides given with
# it, before and after])
EXAMPLES = {
    "algorithm.adv_estimator": (
        GRPO,
        "gae",
        {"learner.algorithm.type": "ppo", "learner.algorithm.whiten_advantages": True},
    ),
    "trainer.total_training_steps": (PPO, 300, {"learner.total_steps": 300}),
    "actor_rollout_ref.actor.use_kl_loss": (PPO, True, {"learner.algorithm.kl_placement": "loss"}),
    "data.tokenizer": (PPO, "/tok", {"model.tokenizer_path": "/tok"}),
    "data.train_files": (PPO, "a.parquet", {"data.train_files": ["a.parquet"]}),
    "data.val_files": (PPO, "[a.parquet, b.parquet]", {"data.test_files": ["a.parquet", "b.parquet"]}),
    "data.val_data_num": (PPO, 50, {"eval.max_prompts": 50}),
    "data.max_prompt_length": (
        PPO,
        2048,
        {"generators.max_response_tokens": 2048, "model.max_seq_len": 2560},
    ),
    "data.max_response_length": (PPO, 300, {"generators.max_tokens_per_turn": 300}),
    "data.max_obs_length": (PPO, 200, {"generators.max_obs_tokens": 200}),
    "data.train_batch_size": (PPO, 256, {"learner.groups_per_step": 256}),
    "data.shuffle_train_dataloader": (PPO, False, {"data.shuffle": False}),
    "actor_rollout_ref.model.path": (PPO, "/models/x", {"model.path": "/models/x"}),
    "actor_rollout_ref.model.enable_gradient_checkpointing": (
        PPO,
        False,
        {"learner.gradient_checkpointing": "none"},  # false/true mean the policies none/full
    ),
    "actor_rollout_ref.actor.ppo_mini_batch_size": (PPO, 128, {"learner.ppo_mini_batch_size": 128}),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (PPO, 32768, {"learner.micro_batch_tokens": 32768}),
    "actor_rollout_ref.actor.grad_clip": (PPO, 0.5, {"learner.grad_clip": 0.5}),
    "actor_rollout_ref.actor.clip_ratio": (
        PPO,
        0.3,
        {"learner.algorithm.clip_low": 0.3, "learner.algorithm.clip_high": 0.3},
    ),
    "actor_rollout_ref.actor.entropy_coeff": (PPO, 0.0, {"learner.algorithm.entropy_coef": 0.0}),
    "actor_rollout_ref.actor.kl_loss_coef": (GRPO, 0.01, {"learner.algorithm.kl_coef": 0.01}),
    "actor_rollout_ref.actor.kl_loss_type": (GRPO, "mse", {"learner.algorithm.kl_estimator": "k2"}),
    "actor_rollout_ref.actor.ppo_epochs": (PPO, 2, {"learner.ppo_epochs": 2}),
    "actor_rollout_ref.actor.optim.lr": (PPO, "3e-6", {"learner.lr": 3e-6}),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": (PPO, 0.1, {"learner.warmup_steps": 100}),
    "actor_rollout_ref.rollout.temperature": (PPO, 0.7, {"generators.temperature": 0.7}),
    "actor_rollout_ref.rollout.top_p": (PPO, 0.9, {"generators.top_p": 0.9}),
    "actor_rollout_ref.rollout.dtype": (PPO, "float16", {"model.dtype": "float16"}),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": (
        PPO,
        2,
        {"generators.engine.tensor_parallel_size": 2},
    ),
    "actor_rollout_ref.rollout.max_num_seqs": (PPO, 64, {"generators.engine.max_num_seqs": 64}),
    "actor_rollout_ref.rollout.n_agent": (GRPO, 8, {"generators.group_size": 8}),
    "critic.optim.lr": (PPO, 2e-5, {"learner.algorithm.critic.lr": 2e-5}),
    "critic.optim.lr_warmup_steps_ratio": (PPO, 0.05, {"learner.algorithm.critic.warmup_steps": 50}),
    "critic.model.path": (PPO, "/models/critic", {"learner.algorithm.critic.model_path": "/models/critic"}),
    "critic.grad_clip": (PPO, 0.5, {"learner.algorithm.critic.grad_clip": 0.5}),
    "critic.cliprange_value": (PPO, 0.2, {"learner.algorithm.critic.value_clip": 0.2}),
    "reward_model.structure_format_score": (PPO, 0.2, {"task.structure_format_score": 0.2}),
    "reward_model.final_format_score": (PPO, 0.1, {"task.final_format_score": 0.1}),
    "reward_model.retrieval_score": (PPO, 0.05, {"task.retrieval_score": 0.05}),
    "retriever.url": (PPO, "http://h:9/retrieve", {"retrieval.client.url": "http://h:9/retrieve"}),
    "retriever.topk": (PPO, 5, {"retrieval.topk": 5}),
    "reranker.do_rerank": (PPO, True, {"retrieval.reranker.enabled": True}, RERANK),
    "reranker.url": (PPO, "http://h:6980/rerank", {"retrieval.reranker.url": "http://h:6980/rerank"}),
    "reranker.topk": (PPO, 2, {"retrieval.topk": 2}, ["reranker.do_rerank=true", *RERANK]),
    "search_url": (PPO, "http://h:9/retrieve", {"retrieval.client.url": "http://h:9/retrieve"}),
    "topk": (PPO, 7, {"retrieval.topk": 7}),
    "algorithm.gamma": (PPO, 0.99, {"learner.algorithm.gamma": 0.99}),
    "algorithm.lam": (PPO, 0.95, {"learner.algorithm.lam": 0.95}),
    "algorithm.kl_penalty": (PPO, "low_var_kl", {"learner.algorithm.kl_estimator": "low_var_kl"}),
    "algorithm.kl_ctrl.type": (PPO, "adaptive", {"learner.algorithm.kl_ctrl.type": "adaptive"}),
    "algorithm.kl_ctrl.kl_coef": (PPO, 0.02, {"learner.algorithm.kl_coef": 0.02}),
    "algorithm.kl_ctrl.horizon": (PPO, 500, {"learner.algorithm.kl_ctrl.horizon": 500}),
    "algorithm.kl_ctrl.target_kl": (PPO, 0.05, {"learner.algorithm.kl_ctrl.target_kl": 0.05}),
    "trainer.project_name": (PPO, "mine", {"logging.wandb_project": "mine"}),
    "trainer.experiment_name": (PPO, "exp1", {"name": "exp1"}),
    "trainer.logger": (PPO, "['console']", {"logging.wandb": False}),
    "trainer.save_freq": (PPO, 25, {"learner.checkpoint_every": 25}),
    "trainer.test_freq": (PPO, -1, {"eval.every_steps": 0}),
    "trainer.critic_warmup": (PPO, 10, {"learner.algorithm.critic_warmup": 10}),
    "max_turns": (PPO, 2, {"generators.max_turns": 2}),
}


def test_every_key_that_sets_a_field_has_an_example():
    assert {k for k, rule in KEYS.items() if rule.sets} == set(EXAMPLES)


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_a_key_sets_its_sr1_fields(key):
    preset, value, expected, *given = EXAMPLES[key]
    context = given[0] if given else []
    before = resolved(preset, context)
    after = resolved(preset, [*context, f"{key}={value}"])
    assert all(same(after[k], v) for k, v in expected.items()), {k: after[k] for k in expected}
    moved = set(differences(before, after)) - set(expected)
    if "learner.algorithm.type" in expected:  # another variant: its own fields, at their defaults
        moved = {k for k in moved if not k.startswith("learner.algorithm.")}
    assert not moved  # nothing else moves


@pytest.mark.parametrize("key", sorted(k for k, rule in KEYS.items() if not rule.sets))
def test_an_accepted_key_changes_nothing(key):
    rule = KEYS[key]
    value = rule.only[0] if rule.only else rule.default if isinstance(rule.default, int | float | str) else 1
    value = 1 if isinstance(value, str) and value.startswith("${") else value
    assert differences(resolved(PPO), resolved(PPO, [f"{key}={text(value)}"])) == {}
    assert rule.note


@pytest.mark.parametrize("key", sorted(k for k, rule in KEYS.items() if rule.only))
def test_a_value_sr1_cannot_honour_is_an_error(key):
    with pytest.raises(ConfigError, match=f"{key}=.*sr1 takes only"):
        load_config(PPO, [f"{key}=unlikely-value"])


def test_critic_keys_leave_grpo_alone_and_kl_follows_its_placement():
    grpo = resolved(GRPO)
    assert differences(grpo, resolved(GRPO, ["critic.optim.lr=3e-5", "algorithm.kl_ctrl.kl_coef=0.5"])) == {}
    # the KL moved into the reward: the reward's coefficient now applies, the loss's does not
    cfg = load_config(
        GRPO,
        [
            "actor_rollout_ref.actor.use_kl_loss=false",
            "algorithm.kl_ctrl.kl_coef=0.5",
            "actor_rollout_ref.actor.kl_loss_coef=0.7",
            "algorithm.kl_penalty=kl",
        ],
    )
    assert (cfg.learner.algorithm.kl_placement, cfg.learner.algorithm.kl_coef) == ("reward", 0.5)
    assert cfg.learner.algorithm.kl_estimator == "k1"


def test_warmup_ratio_uses_the_total_steps_of_the_same_overrides():
    cfg = load_config(
        "tiny",
        ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285", "trainer.total_training_steps=1005"],
    )
    assert cfg.learner.warmup_steps == 286


def test_an_sr1_key_wins_over_the_search_r1_key_for_the_same_field():
    overrides = ["learner.lr=2e-6", "actor_rollout_ref.actor.optim.lr=5e-6", "+trainer.val_before_train=true"]
    assert load_config("tiny", overrides).learner.lr == pytest.approx(2e-6)


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "actor_rollout_ref.actor.optim.lrr=1",
            "closest sr1 keys: learner.lr.*closest Search-R1 keys: actor_rollout_ref.actor.optim.lr",
        ),
        (
            "trainer.totl_training_steps=3",
            "unknown config key 'trainer.totl_training_steps'.*trainer.total_training_steps",
        ),
        ("data.val_filez=x", "unknown config key 'data.val_filez'.*closest Search-R1 keys: data.val_files"),
        (
            "actor_rollout_ref.actor.optim.lr=fast",
            r"actor_rollout_ref.actor.optim.lr=fast' \(sr1: learner.lr=",
        ),
        (
            "data.train_batch_size=0",
            r"data.train_batch_size=0' \(sr1: learner.groups_per_step=0\).*greater than",
        ),
        (
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=2",
            r"lr_warmup_steps_ratio=2 \(sr1: learner.warmup_steps\)",
        ),
        ("algorithm.adv_estimator=rloo", "expected gae or grpo"),
        ("actor_rollout_ref.rollout.n=5", "rollout.n_agent"),
    ],
)
def test_bad_search_r1_overrides_name_both_spellings(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config("tiny", [override])


def test_a_job_takes_search_r1_overrides():
    job = load_job(LearnerJob, PPO, ["actor_rollout_ref.actor.optim.lr=4e-6", "critic.optim.lr=3e-5"])
    assert job.learner.lr == pytest.approx(4e-6)
    assert job.learner.algorithm.critic.lr == pytest.approx(3e-5)


def test_verl_defaults_translate_with_no_unknown_key():
    theirs = resolve_interpolations(verl_defaults() | {"actor_rollout_ref.actor.state_masking": True})
    base = load_config(PPO)

    def lookup(dotted):
        node = base
        for part in dotted.split("."):
            node = getattr(node, part, None)
        return node

    translation = translate(theirs, lookup)
    assert set(translation.notes) == set(theirs)
    assert translation.values["learner.algorithm.type"] == "ppo"


def test_the_table_holds_verl_trainer_defaults_as_search_r1_ships_them():
    mirror = Path("/work/.mirror/PeterGriffinJin+Search-R1/repo")
    if not mirror.is_dir():
        pytest.skip("Search-R1's repository is not mirrored here")
    shipped = yaml.safe_load(
        subprocess.run(
            ["git", "-C", str(mirror), "show", "HEAD:verl/trainer/config/ppo_trainer.yaml"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )

    def number(value):  # PyYAML reads `1e-6` as text; Hydra reads it as a float
        return float(value) if isinstance(value, str) and value[:1].isdigit() and "e-" in value else value

    assert {k: number(v) for k, v in flat(shipped).items()} == verl_defaults()


# -- whole scripts --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script, preset", [("v0.2_train_ppo.sh", PPO), ("v0.2_train_grpo.sh", GRPO)])
@pytest.mark.parametrize("base", ["auto", None])
def test_search_r1_v02_scripts_give_sr1_presets(tmp_path, script, preset, base):
    """The published nq_hotpotqa v0.2 scripts resolve to the presets but for the run name and the model the script
    picks; with no base preset (sr1's defaults below), every field the script determines has the preset's value."""
    translation = translate_script((SCRIPTS / script).read_text(), base, env={})
    path = tmp_path / "translated.yaml"
    path.write_text(preset_yaml(translation, script))
    diff = differences(resolved(path), resolved(preset))
    if base is None:
        diff = {k: v for k, v in diff.items() if k in translation.comments}
        assert len(translation.comments) >= 40 and set(IMPLIED) <= set(translation.comments)
    assert set(diff) == {"name", "model.path"}, diff
    assert diff["model.path"][0] == "Qwen/Qwen2.5-7B"


def test_top_level_scripts_differ_from_the_presets_where_they_set_other_values(tmp_path):
    ppo = translate_script((SCRIPTS / "train_ppo.sh").read_text(), env={})
    path = tmp_path / "ppo.yaml"
    path.write_text(preset_yaml(ppo, "train_ppo.sh"))
    assert set(differences(resolved(path), resolved(PPO))) == {
        "name",
        "model.path",
        "data.train_files",
        "data.test_files",
        "generators.max_turns",
        "eval.every_steps",
        "generators.top_p",  # the top-level PPO script keeps verl's top_p default, 0.95
    }
    with pytest.raises(ScriptError, match=r"line 8: \$TRAIN_DATA_DIR is not set"):
        translate_script((SCRIPTS / "train_grpo.sh").read_text(), env={})
    grpo = translate_script(
        (SCRIPTS / "train_grpo.sh").read_text(), env={"TRAIN_DATA_DIR": "d", "TEST_DATA_DIR": "d"}
    )
    assert grpo.preset["generators"]["max_turns"] == 2


RERANKED = {
    "retrieval.reranker.enabled": True,
    "retrieval.reranker.url": "http://10.100.20.21:6980/rerank",
    "retrieval.reranker.candidates": 10,  # retriever.topk: what is retrieved, then reranked
    "retrieval.topk": 3,  # reranker.topk: what a search keeps
    "retrieval.client.url": "http://10.100.20.17:8000/retrieve",
}


def test_the_reranking_train_ppo_translates_its_reranker(tmp_path):
    """The published train_ppo.sh that reranks (`reranker.do_rerank=true reranker.url=... reranker.topk=3` after
    `retriever.topk=10`): the generators rerank 10 candidates at that URL and keep 3."""
    script = (SCRIPTS / "rerank_train_ppo.sh").read_text()
    translation = translate_script(script, env={})
    path = tmp_path / "rerank.yaml"
    path.write_text(preset_yaml(translation, "rerank_train_ppo.sh"))
    cfg = resolved(path)
    assert {k: cfg[k] for k in RERANKED} == RERANKED
    assert translation.comments["retrieval.reranker.url"] == (
        "reranker.url='http://10.100.20.21:6980/rerank' (line 69)"
    )
    assert translation.comments["retrieval.reranker.candidates"] == "retriever.topk=10 (line 67)"


@pytest.mark.parametrize(
    "script, preset, extra",
    [
        ("v0.2_train_ppo.sh", PPO, []),
        ("v0.2_train_grpo.sh", GRPO, []),
        ("train_ppo.sh", PPO, []),
        ("train_grpo.sh", GRPO, []),
        ("rerank_train_ppo.sh", PPO, []),
        # the GRPO script with the reranking script's keys added, as a user would
        (
            "v0.2_train_grpo.sh",
            GRPO,
            ["reranker.do_rerank=true", "reranker.url=http://h:6980/rerank", "reranker.topk=3"],
        ),
    ],
)
def test_published_overrides_as_they_are_are_accepted_on_the_presets(script, preset, extra):
    """Each script's overrides exactly as its command passes them (variables expanded), given to the preset as
    `sr1 config show PRESET ...` gives them."""
    tokens = parse_script(
        (SCRIPTS / script).read_text(), env={"TRAIN_DATA_DIR": "d", "TEST_DATA_DIR": "d"}
    ).tokens
    assert len(tokens) >= 40 and any(t.startswith("+trainer.") for t in tokens)
    cfg = load_config(preset, [*tokens, *extra])
    assert cfg.learner.groups_per_step == 512
    reranks = any(t.startswith("reranker.do_rerank=true") for t in [*tokens, *extra])
    assert cfg.retrieval.reranker.enabled == reranks
    if reranks:
        assert cfg.retrieval.reranker.url.endswith(":6980/rerank") and cfg.retrieval.topk == 3


def test_a_translated_preset_comments_each_key_with_its_line():
    text = preset_yaml(translate_script((SCRIPTS / "v0.2_train_grpo.sh").read_text(), env={}), "x.sh")
    assert "group_size: 5  # actor_rollout_ref.rollout.n_agent=5 (line 41)" in text
    assert "top_p: 0.95  # actor_rollout_ref.rollout.top_p=0.95 (verl default)" in text
    assert "free_cache_engine" in text  # accepted keys are listed with what sr1 does instead


@pytest.mark.parametrize(
    "script, expected",
    [
        ("X='open\npython3 -m verl.trainer.main_ppo a=1\n", "line 1: cannot parse"),
        (
            "python3 -m verl.trainer.main_ppo \\\n  data.train_batch_size=1 \\\n  stray \\\n  max_turns=2\n",
            "line 3: cannot read 'stray'",
        ),
        ("python3 -m verl.trainer.main_ppo \\\n  data.train_files=$NOPE/x\n", r"line 2: \$NOPE is not set"),
        ("echo hello\n", "no `python -m verl.trainer.main_ppo` command"),
        (
            "python3 -m verl.trainer.main_ppo \\\n  actor_rollout_ref.actor.optim.lrr=1\n",
            "line 2: actor_rollout_ref.actor.optim.lrr .*closest Search-R1 keys: actor_rollout_ref.actor.optim.lr",
        ),
        (
            "python3 -m verl.trainer.main_ppo \\\n  actor_rollout_ref.actor.state_masking=true \\\n  data.prompt_key=q\n",
            "line 3: data.prompt_key='q': sr1 takes only 'prompt'",
        ),
    ],
)
def test_a_script_that_cannot_be_read_names_the_line(script, expected):
    with pytest.raises(ScriptError, match=expected):
        translate_script(script, env={})


def test_script_variables_and_continuations():
    parsed = parse_script(
        "A=x\nexport B=${A}/y\nPYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \\\n"
        '  data.train_files=$B/t.parquet +trainer.val_only=false \\\n  retriever.url="http://h:1/r"'
        " 2>&1 | tee log\n",
        env={},
    )
    assert parsed.values == {
        "data.train_files": "x/y/t.parquet",
        "trainer.val_only": False,
        "retriever.url": "http://h:1/r",
    }
    assert parsed.lines == {"data.train_files": 4, "trainer.val_only": 4, "retriever.url": 5}


# -- the commands and the document ----------------------------------------------------------------------------------


def _sr1(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sr1", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def test_config_show_takes_search_r1_overrides():
    shown = _sr1("config", "show", "tiny", "actor_rollout_ref.actor.optim.lr=1e-6")
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["learner"]["lr"] == pytest.approx(1e-6)


def test_config_show_takes_the_reranking_scripts_overrides():
    tokens = parse_script((SCRIPTS / "rerank_train_ppo.sh").read_text(), env={}).tokens
    shown = _sr1("config", "show", PPO, *tokens)
    assert shown.returncode == 0, shown.stderr
    assert {k: v for k, v in flat(yaml.safe_load(shown.stdout)).items() if k in RERANKED} == RERANKED
    refused = _sr1("config", "show", PPO, "reranker.do_rerank=true")
    assert refused.returncode != 0
    assert "neither retrieval.reranker.model" in refused.stderr and "reranker.url" in refused.stderr


def test_from_search_r1_writes_a_preset_that_loads(tmp_path):
    out = tmp_path / "grpo.yaml"
    done = _sr1("config", "from-search-r1", str(SCRIPTS / "v0.2_train_grpo.sh"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert load_config(out).generators.group_size == 5
    failed = _sr1(
        "config", "from-search-r1", str(SCRIPTS / "train_grpo.sh"), "-o", str(tmp_path / "bad.yaml")
    )
    assert failed.returncode == 2 and "TRAIN_DATA_DIR" in failed.stderr
    assert not (tmp_path / "bad.yaml").exists()


def test_the_search_r1_keys_document_is_current():
    assert (ROOT / "docs" / "search-r1-keys.md").read_text() == search_r1_keys_doc(), (
        "regenerate it: sr1 config search-r1-keys > docs/search-r1-keys.md"
    )


def test_run_and_the_pool_launchers_take_search_r1_overrides(monkeypatch):
    import argparse

    from sr1.launch import pools
    from sr1.launch.pools import _load
    from sr1.run import _resolve, build_parser, parse_args

    args = parse_args(build_parser(), ["actor_rollout_ref.rollout.n_agent=3", "max_turns=1"])
    cfg, _ = _resolve(args)
    assert (cfg.name, cfg.generators.group_size, cfg.generators.max_turns) == ("tiny", 3, 1)
    pool = argparse.Namespace(
        config=PPO, overrides=["critic.optim.lr=7e-6"], redis_url="redis://127.0.0.1:1/0"
    )
    monkeypatch.setattr(
        pools, "check_inputs", lambda cfg, splits: []
    )  # the preset's model and data are not here
    assert _load(pool, "sr1 learner", ("train",)).learner.algorithm.critic.lr == pytest.approx(7e-6)


def test_a_search_r1_key_for_a_section_the_job_lacks_is_named(tmp_path):
    from config import save_job

    job_file = save_job(load_config(PPO).learner_job(), tmp_path / "learner.yaml")
    assert load_job(LearnerJob, job_file, ["critic.optim.lr=3e-5"]).learner.algorithm.critic.lr == 3e-5
    with pytest.raises(
        ConfigError, match=r"retriever.topk=5' \(sr1: retrieval.topk\): unknown config key 'retrieval'"
    ):
        load_job(LearnerJob, job_file, ["retriever.topk=5"])
    assert load_config("tiny", ["name=1e3"]).name == "1e3"  # sr1's own values keep YAML's reading


def test_an_accepted_override_says_what_sr1_does_instead(caplog):
    with caplog.at_level("WARNING", logger="config"):
        load_config("tiny", ["actor_rollout_ref.rollout.free_cache_engine=false"])
    assert (
        "free_cache_engine=false': actor_rollout_ref.rollout.free_cache_engine: accepted; verl frees"
        in caplog.text
    )
