"""Search-R1's (verl's) config keys: every key its scripts and trainer defaults use, and how each carries over.

`KEYS` is the one table: a key either sets sr1 fields (`Rule.sets`, its value converted where the units differ:
warmup ratio -> steps, `adv_estimator` -> algorithm) or is accepted because sr1 does the same thing another way
(`Rule.sets` empty; the note says what sr1 does instead). A key whose value sr1 cannot honour lists the values it
can (`Rule.only`); any other value is an error. The table's order is the order of translation (`config/search_r1.py`
applies it to overrides); `docs/search-r1-keys.md` is rendered from it (`config/search_r1_script.py`). `IMPLIED`:
what a whole script's translation also sets (what verl fixes in code, Search-R1's schedule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Lookup = Callable[
    [str], Any
]  # an sr1 dotted key -> its value (what the translation set so far, else the base)
Convert = Callable[[Any, Lookup], dict[str, Any]]


@dataclass(frozen=True)
class Rule:
    """How one Search-R1 key carries over.

    sets:    the sr1 fields it sets (empty: accepted, sr1 does it another way)
    note:    one line: the conversion, or what sr1 does instead
    default: its value in verl's trainer defaults (`ppo_trainer.yaml`); `${a.b}` follows another key
    convert: value -> {sr1 key: value}; None: the value goes unchanged to the one field in `sets`
    only:    the values sr1 can honour (others are errors); None: any value
    """

    sets: tuple[str, ...]
    note: str
    default: Any = None
    convert: Convert | None = None
    only: tuple[Any, ...] | None = None


NO_DEFAULT = object()  # keys of the scripts that verl's defaults do not have


def _same(sr1_key: str, note: str = "", default: Any = NO_DEFAULT) -> Rule:
    return Rule((sr1_key,), note, default)


def _accepted(note: str, default: Any = NO_DEFAULT, only: tuple[Any, ...] | None = None) -> Rule:
    return Rule((), note, default, only=only)


def _when(sr1_key: str, wanted: tuple[Any, ...], then: str, ratio: bool = False) -> Convert:
    """Set `then` only while `sr1_key` (already translated, or the base) is one of `wanted`."""

    def convert(value: Any, lookup: Lookup) -> dict[str, Any]:
        if lookup(sr1_key) not in wanted:
            return {}
        return {then: _warmup(value, lookup) if ratio else value}

    return convert


def _warmup(ratio: Any, lookup: Lookup) -> int:
    # verl truncates ratio x total steps to an int (its FSDP workers' warmup)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
        raise ValueError(f"expected a ratio between 0 and 1, got {ratio!r}")
    return int(ratio * lookup("learner.total_steps"))


def _adv_estimator(value: Any, lookup: Lookup) -> dict[str, Any]:
    if value == "gae":  # verl whitens GAE advantages over the batch, always
        return {"learner.algorithm.type": "ppo", "learner.algorithm.whiten_advantages": True}
    if value == "grpo":
        return {"learner.algorithm.type": "grpo"}
    raise ValueError(f"expected gae or grpo (Search-R1's two estimators), got {value!r}")


_KL_ESTIMATORS = {"kl": "k1", "mse": "k2", "low_var_kl": "low_var_kl"}


def _kl_estimator(placement: str) -> Convert:
    def convert(value: Any, lookup: Lookup) -> dict[str, Any]:
        if value not in _KL_ESTIMATORS:
            raise ValueError(f"expected one of {', '.join(_KL_ESTIMATORS)}, got {value!r}")
        if lookup("learner.algorithm.kl_placement") != placement:
            return {}
        return {"learner.algorithm.kl_estimator": _KL_ESTIMATORS[value]}

    return convert


def _files(sr1_key: str) -> Convert:
    return lambda value, lookup: {sr1_key: value if isinstance(value, list) else [value]}


def _if_given(sr1_key: str) -> Convert:
    return lambda value, lookup: {} if value is None else {sr1_key: value}


def _response_budget(value: Any, lookup: Lookup) -> dict[str, Any]:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a number of tokens, got {value!r}")
    return {
        "generators.max_response_tokens": value,
        "model.max_seq_len": lookup("model.max_prompt_tokens") + value,
    }


def _logger(value: Any, lookup: Lookup) -> dict[str, Any]:
    loggers = value if isinstance(value, list) else [value]
    return (
        {"logging.wandb": True, "logging.wandb_mode": "online"}
        if "wandb" in loggers
        else {"logging.wandb": False}
    )


def _every(sr1_key: str, never: int | None) -> Convert:
    def convert(value: Any, lookup: Lookup) -> dict[str, Any]:
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            return {} if never is None else {sr1_key: never}
        return {sr1_key: value}

    return convert


def _critic_model(value: Any, lookup: Lookup) -> dict[str, Any]:
    if lookup("learner.algorithm.type") != "ppo":
        return {}
    # the policy's own model is sr1's default (None), whichever spelling names it
    return {"learner.algorithm.critic.model_path": None if value == lookup("model.path") else value}


def _retrieved_topk(value: Any, lookup: Lookup) -> dict[str, Any]:
    # Search-R1 retrieves retriever.topk documents; with do_rerank it reranks them and keeps reranker.topk
    if lookup("retrieval.reranker.enabled"):
        return {"retrieval.reranker.candidates": value}
    return {"retrieval.topk": value}


def _ppo(sr1_key: str, ratio: bool = False) -> Convert:
    return _when("learner.algorithm.type", ("ppo",), sr1_key, ratio)


_PACKING = (
    "sr1 packs micro-batches by tokens without padding (learner.micro_batch_tokens), for every forward pass"
)
_OFFLOAD = (
    "sr1's learner has GPUs of its own (no colocated rollout to make room for); learner.cpu_offload "
    "offloads parameters, gradients and optimizer state together"
)
_WRAP = "sr1 shards each decoder layer with FSDP2 over all learner.num_ranks"
_NO_SP = "sr1 has no sequence parallelism"
_SCHEDULE = "sr1's schedule is linear warmup then constant (verl's 'constant' style)"
_FILLED = "verl fills it from trainer.total_training_steps; sr1 uses learner.total_steps"
_NO_RM = (
    "sr1 has no reward model (reward_model.enable=false): the task's rule-based reward scores trajectories"
)
_CRITIC = "(ppo only; ignored by grpo, which has no critic)"

# Search-R1 key -> how it carries over; the order is the order of translation (a rule may read what an earlier one
# set: the algorithm before its knobs, the KL placement before the coefficient, total steps before warmup ratios)
# fmt: off
KEYS: dict[str, Rule] = {
    # -- algorithm and schedule first: later rules depend on them
    "algorithm.adv_estimator": Rule(("learner.algorithm.type", "learner.algorithm.whiten_advantages"),
        "gae -> ppo (advantages whitened, as verl does), grpo -> grpo", "gae", _adv_estimator),
    "trainer.total_training_steps": Rule(("learner.total_steps",), "null: keep learner.total_steps", None,
        _if_given("learner.total_steps")),
    "actor_rollout_ref.actor.use_kl_loss": Rule(("learner.algorithm.kl_placement",),
        "true -> loss (KL in the policy loss), false -> reward (KL in the reward)", False,
        lambda v, _: {"learner.algorithm.kl_placement": "loss" if v else "reward"}),
    # -- data
    "data.tokenizer": Rule(("model.tokenizer_path",), "null: the model's own tokenizer", None,
        _if_given("model.tokenizer_path")),
    "data.train_files": Rule(("data.train_files",), "one file or a list", "~/data/rlhf/gsm8k/train.parquet",
        _files("data.train_files")),
    "data.val_files": Rule(("data.test_files",), "one file or a list", "~/data/rlhf/gsm8k/test.parquet",
        _files("data.test_files")),
    "data.train_data_num": _accepted("sr1 trains on every prompt of data.train_files (cut the file to use fewer)",
        None, only=(None,)),
    "data.val_data_num": Rule(("eval.max_prompts",),
        "null: keep eval.max_prompts (a seeded sample per evaluation during training; `sr1 eval` reads the whole "
        "test set)", None, _if_given("eval.max_prompts")),
    "data.prompt_key": _accepted("sr1 reads Search-R1's parquet layout, whose prompts are in `prompt`", "prompt",
        only=("prompt",)),
    "data.max_prompt_length": Rule(("generators.max_response_tokens", "model.max_seq_len"),
        "Search-R1 keeps the last this-many tokens of the rolling context; sr1 gives the response (turns and "
        "observations) this budget after the prompt, and model.max_seq_len = model.max_prompt_tokens + it", 512,
        _response_budget),
    "data.max_response_length": _same("generators.max_tokens_per_turn", "tokens sampled per turn", 512),
    "data.max_start_length": _accepted(
        "Search-R1 keeps the question's last this-many tokens; sr1 rejects prompts over model.max_prompt_tokens "
        "(its Search-R1 presets: 512)", 256),
    "data.max_obs_length": _same("generators.max_obs_tokens", "retrieved tokens per observation", 512),
    "data.train_batch_size": _same("learner.groups_per_step", "prompts per step: one group each", 1024),
    "data.val_batch_size": _accepted("the generator workers answer evaluations at their engines' batch size", 1312),
    "data.return_raw_input_ids": _accepted(
        "re-tokenisation switch: sr1 trains on the engine's own token ids and never re-tokenises", False),
    "data.return_raw_chat": _accepted("re-tokenisation switch: sr1 never re-tokenises (no reward model)", False),
    "data.shuffle_train_dataloader": _same("data.shuffle", "a new seeded order each epoch", True),
    # -- the policy
    "actor_rollout_ref.hybrid_engine": _accepted(
        "colocation: sr1 never colocates; generators and learner own their GPUs (generators.num_engines, "
        "learner.num_ranks)", True),
    "actor_rollout_ref.model.path": _same("model.path", "an HF directory, a cached hub id or a verl checkpoint",
        "~/models/deepseek-llm-7b-chat"),
    "actor_rollout_ref.model.external_lib": _accepted("sr1 loads models with transformers' Auto classes", None,
        only=(None,)),
    "actor_rollout_ref.model.override_config": _accepted("sr1 loads the model's own config", {}, only=({},)),
    "actor_rollout_ref.model.enable_gradient_checkpointing": _same("learner.gradient_checkpointing", "", False),
    "actor_rollout_ref.model.use_remove_padding": _accepted(_PACKING, False),
    "actor_rollout_ref.actor.strategy": _accepted("sr1's learner is FSDP2", "fsdp", only=("fsdp",)),
    "actor_rollout_ref.actor.ppo_mini_batch_size": _same("learner.ppo_mini_batch_size",
        "trajectories per update: Search-R1 repeats each prompt n_agent times before it counts (rollout.n is 1), "
        "so its count is sr1's", 256),
    "actor_rollout_ref.actor.ppo_micro_batch_size": _accepted(_PACKING, 64),
    "actor_rollout_ref.actor.use_dynamic_bsz": _accepted(_PACKING, False),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": _same("learner.micro_batch_tokens",
        "token budget of one packed micro-batch (sr1 always packs by tokens)", 16384),
    "actor_rollout_ref.actor.grad_clip": _same("learner.grad_clip", "", 1.0),
    "actor_rollout_ref.actor.state_masking": _accepted(
        "sr1 always keeps retrieved tokens out of the loss (Search-R1's scripts set it)", False, only=(True,)),
    "actor_rollout_ref.actor.clip_ratio": Rule(("learner.algorithm.clip_low", "learner.algorithm.clip_high"),
        "both sides of the clip", 0.2,
        lambda v, _: {"learner.algorithm.clip_low": v, "learner.algorithm.clip_high": v}),
    "actor_rollout_ref.actor.entropy_coeff": _same("learner.algorithm.entropy_coef", "", 0.001),
    "actor_rollout_ref.actor.kl_loss_coef": Rule(("learner.algorithm.kl_coef",),
        "when use_kl_loss (KL in the loss)", 0.001,
        _when("learner.algorithm.kl_placement", ("loss",), "learner.algorithm.kl_coef")),
    "actor_rollout_ref.actor.kl_loss_type": Rule(("learner.algorithm.kl_estimator",),
        "when use_kl_loss: kl -> k1, mse -> k2, low_var_kl", "low_var_kl", _kl_estimator("loss")),
    "actor_rollout_ref.actor.ppo_epochs": _same("learner.ppo_epochs", "", 1),
    "actor_rollout_ref.actor.shuffle": _accepted("sr1 takes the mini-batches in the batch's order", False,
        only=(False,)),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": _accepted(_NO_SP, 1, only=(1,)),
    "actor_rollout_ref.actor.optim.lr": _same("learner.lr", "", 1e-6),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": Rule(("learner.warmup_steps",),
        "x learner.total_steps, truncated (as verl)", 0.0,
        lambda v, lookup: {"learner.warmup_steps": _warmup(v, lookup)}),
    "actor_rollout_ref.actor.optim.min_lr_ratio": _accepted(_SCHEDULE, None, only=(None,)),
    "actor_rollout_ref.actor.optim.warmup_style": _accepted(_SCHEDULE, "constant", only=("constant",)),
    "actor_rollout_ref.actor.optim.total_training_steps": _accepted(_FILLED, -1),
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params": _accepted(_WRAP, 0),
    "actor_rollout_ref.actor.fsdp_config.param_offload": _accepted(_OFFLOAD, False),
    "actor_rollout_ref.actor.fsdp_config.grad_offload": _accepted(_OFFLOAD, False),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": _accepted(_OFFLOAD, False),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": _accepted(_WRAP, -1, only=(-1,)),
    "actor_rollout_ref.ref.fsdp_config.param_offload": _accepted(_OFFLOAD, False),
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params": _accepted(_WRAP, 0),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": _accepted(_WRAP, -1, only=(-1,)),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": _accepted(_PACKING, 128),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": _accepted(_PACKING,
        "${actor_rollout_ref.actor.use_dynamic_bsz}"),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": _accepted(_PACKING,
        "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": _accepted(_NO_SP,
        "${actor_rollout_ref.actor.ulysses_sequence_parallel_size}", only=(1,)),
    # -- rollout
    "actor_rollout_ref.rollout.name": _accepted("sr1's generators are vLLM engines", "vllm", only=("vllm",)),
    "actor_rollout_ref.rollout.temperature": _same("generators.temperature", "", 1.0),
    "actor_rollout_ref.rollout.top_k": _accepted("sr1 samples without a top-k cut (-1: off)", -1, only=(-1, 0)),
    "actor_rollout_ref.rollout.top_p": _same("generators.top_p", "", 0.95),
    "actor_rollout_ref.rollout.prompt_length": _accepted("follows data.max_prompt_length",
        "${data.max_prompt_length}"),
    "actor_rollout_ref.rollout.response_length": _accepted("follows data.max_response_length",
        "${data.max_response_length}"),
    "actor_rollout_ref.rollout.dtype": _same("model.dtype", "engines and learner share it", "bfloat16"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": _accepted(
        "GPU memory fraction: verl's vLLM shares each GPU with training; sr1's engines own theirs "
        "(generators.engine.gpu_memory_utilization)", 0.5),
    "actor_rollout_ref.rollout.ignore_eos": _accepted("sr1 stops at EOS", False, only=(False,)),
    "actor_rollout_ref.rollout.enforce_eager": _accepted(
        "verl turns CUDA graphs off so the colocated engine can free memory for training; sr1's engines keep them"
        " (generators.engine.enforce_eager)", True),
    "actor_rollout_ref.rollout.free_cache_engine": _accepted(
        "verl frees the KV cache for training after each rollout; sr1's engines keep it (training runs elsewhere)",
        True),
    "actor_rollout_ref.rollout.load_format": _accepted(
        "verl starts vLLM with dummy weights and copies FSDP's in; sr1's engines load model.path, then receive "
        "broadcasts", "dummy_dtensor"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": _same("generators.engine.tensor_parallel_size", "", 2),
    "actor_rollout_ref.rollout.max_num_batched_tokens": _accepted(
        "vLLM's prefill budget: sr1 leaves vLLM's default (generators.engine.extra_args sets it)", 8192),
    "actor_rollout_ref.rollout.max_num_seqs": _same("generators.engine.max_num_seqs", "per engine", 1024),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": _accepted(_PACKING, 128),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": _accepted(_PACKING,
        "${actor_rollout_ref.actor.use_dynamic_bsz}"),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": _accepted(_PACKING,
        "${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}"),
    "actor_rollout_ref.rollout.do_sample": _accepted("sr1 samples in training and decodes greedily in evaluation",
        True, only=(True,)),
    "actor_rollout_ref.rollout.n": _accepted("Search-R1 samples a prompt's group with rollout.n_agent", 1, only=(1,)),
    "actor_rollout_ref.rollout.n_agent": _same("generators.group_size", "samples per prompt", 1),
    # -- the critic (ppo)
    "critic.strategy": _accepted("sr1's critic is FSDP2", "fsdp", only=("fsdp",)),
    "critic.optim.lr": Rule(("learner.algorithm.critic.lr",), _CRITIC, 1e-5, _ppo("learner.algorithm.critic.lr")),
    "critic.optim.lr_warmup_steps_ratio": Rule(("learner.algorithm.critic.warmup_steps",),
        f"x learner.total_steps, truncated {_CRITIC}", 0.0,
        _ppo("learner.algorithm.critic.warmup_steps", ratio=True)),
    "critic.optim.min_lr_ratio": _accepted(_SCHEDULE, None, only=(None,)),
    "critic.optim.warmup_style": _accepted(_SCHEDULE, "constant", only=("constant",)),
    "critic.optim.total_training_steps": _accepted(_FILLED, -1),
    "critic.model.path": Rule(("learner.algorithm.critic.model_path",), f"the policy's path -> null {_CRITIC}",
        "~/models/deepseek-llm-7b-chat", _critic_model),
    "critic.model.tokenizer_path": _accepted("the critic reads the policy's token ids",
        "${actor_rollout_ref.model.path}"),
    "critic.model.override_config": _accepted("sr1 loads the model's own config", {}, only=({},)),
    "critic.model.external_lib": _accepted("sr1 loads models with transformers' Auto classes",
        "${actor_rollout_ref.model.external_lib}", only=(None,)),
    "critic.model.enable_gradient_checkpointing": _accepted("sr1's critic follows learner.gradient_checkpointing",
        False),
    "critic.model.use_remove_padding": _accepted(_PACKING, False),
    "critic.model.fsdp_config.param_offload": _accepted(_OFFLOAD, False),
    "critic.model.fsdp_config.grad_offload": _accepted(_OFFLOAD, False),
    "critic.model.fsdp_config.optimizer_offload": _accepted(_OFFLOAD, False),
    "critic.model.fsdp_config.wrap_policy.min_num_params": _accepted(_WRAP, 0),
    "critic.model.fsdp_config.fsdp_size": _accepted(_WRAP, -1, only=(-1,)),
    "critic.ppo_mini_batch_size": _accepted("sr1's critic updates on the policy's mini-batches",
        "${actor_rollout_ref.actor.ppo_mini_batch_size}"),
    "critic.ppo_micro_batch_size": _accepted(_PACKING, 64),
    "critic.forward_micro_batch_size": _accepted(_PACKING, "${critic.ppo_micro_batch_size}"),
    "critic.use_dynamic_bsz": _accepted(_PACKING, "${actor_rollout_ref.actor.use_dynamic_bsz}"),
    "critic.ppo_max_token_len_per_gpu": _accepted(_PACKING, 32768),
    "critic.forward_max_token_len_per_gpu": _accepted(_PACKING, "${critic.ppo_max_token_len_per_gpu}"),
    "critic.ulysses_sequence_parallel_size": _accepted(_NO_SP, 1, only=(1,)),
    "critic.ppo_epochs": _accepted("sr1's critic follows learner.ppo_epochs",
        "${actor_rollout_ref.actor.ppo_epochs}"),
    "critic.shuffle": _accepted("sr1 takes the mini-batches in the batch's order",
        "${actor_rollout_ref.actor.shuffle}", only=(False,)),
    "critic.grad_clip": Rule(("learner.algorithm.critic.grad_clip",), _CRITIC, 1.0,
        _ppo("learner.algorithm.critic.grad_clip")),
    "critic.cliprange_value": Rule(("learner.algorithm.critic.value_clip",), _CRITIC, 0.5,
        _ppo("learner.algorithm.critic.value_clip")),
    # -- reward
    "reward_model.enable": _accepted(_NO_RM, False, only=(False,)),
    "reward_model.strategy": _accepted(_NO_RM, "fsdp"),
    "reward_model.model.input_tokenizer": _accepted(_NO_RM, "${actor_rollout_ref.model.path}"),
    "reward_model.model.path": _accepted(_NO_RM, "~/models/FsfairX-LLaMA3-RM-v0.1"),
    "reward_model.model.external_lib": _accepted(_NO_RM, "${actor_rollout_ref.model.external_lib}"),
    "reward_model.model.use_remove_padding": _accepted(_NO_RM, False),
    "reward_model.model.fsdp_config.min_num_params": _accepted(_NO_RM, 0),
    "reward_model.model.fsdp_config.param_offload": _accepted(_NO_RM, False),
    "reward_model.micro_batch_size": _accepted(_NO_RM, 64),
    "reward_model.max_length": _accepted(_NO_RM, None),
    "reward_model.ulysses_sequence_parallel_size": _accepted(_NO_RM, 1),
    "reward_model.use_dynamic_bsz": _accepted(_NO_RM, "${critic.use_dynamic_bsz}"),
    "reward_model.forward_max_token_len_per_gpu": _accepted(_NO_RM, "${critic.forward_max_token_len_per_gpu}"),
    "reward_model.structure_format_score": _same("task.structure_format_score", "format_em's score", 0),
    "reward_model.final_format_score": _same("task.final_format_score", "format_em's score", 0),
    "reward_model.retrieval_score": _same("task.retrieval_score", "format_em's score", 0),
    # -- retrieval (the reranker's switch first: it decides what retriever.topk counts)
    "reranker.do_rerank": _same("retrieval.reranker.enabled",
        "rerank each search's retriever.topk candidates and keep reranker.topk: at reranker.url from the generators "
        "(retrieval.reranker.url), or in sr1's retrieval server with retrieval.reranker.model (a cross-encoder). "
        "Search-R1's reranking version of train_ppo.sh passes it"),
    "reranker.url": _same("retrieval.reranker.url",
        "a /rerank endpoint speaking Search-R1's rerank API: its rerank_server.py (port 6980), or an sr1 retrieval "
        "server with retrieval.reranker.model; used when do_rerank is true"),
    "reranker.topk": Rule(("retrieval.topk",),
        "with do_rerank: the documents a search keeps after reranking; without it ignored, as in Search-R1",
        NO_DEFAULT, _when("retrieval.reranker.enabled", (True,), "retrieval.topk")),
    "retriever.url": _same("retrieval.client.url", "", "http://127.0.0.1:8000/retrieve"),
    "retriever.topk": Rule(("retrieval.topk", "retrieval.reranker.candidates"),
        "documents per search; with do_rerank, the candidates reranked", 3, _retrieved_topk),
    "search_url": _same("retrieval.client.url", "the retriever URL's other spelling"),
    "topk": Rule(("retrieval.topk", "retrieval.reranker.candidates"), "the retriever top-k's other spelling",
        NO_DEFAULT, _retrieved_topk),
    # -- algorithm
    "algorithm.gamma": Rule(("learner.algorithm.gamma",), "(ppo only)", 1.0, _ppo("learner.algorithm.gamma")),
    "algorithm.lam": Rule(("learner.algorithm.lam",), "(ppo only)", 1.0, _ppo("learner.algorithm.lam")),
    "algorithm.no_think_rl": _accepted("sr1 trains on the whole response", False, only=(False,)),
    "algorithm.kl_penalty": Rule(("learner.algorithm.kl_estimator",),
        "when not use_kl_loss: kl -> k1, mse -> k2, low_var_kl", "kl", _kl_estimator("reward")),
    "algorithm.kl_ctrl.type": _same("learner.algorithm.kl_ctrl.type", "fixed or adaptive", "fixed"),
    "algorithm.kl_ctrl.kl_coef": Rule(("learner.algorithm.kl_coef",), "when not use_kl_loss (KL in the reward)",
        0.001, _when("learner.algorithm.kl_placement", ("reward",), "learner.algorithm.kl_coef")),
    "algorithm.kl_ctrl.horizon": _same("learner.algorithm.kl_ctrl.horizon", "adaptive only"),
    "algorithm.kl_ctrl.target_kl": _same("learner.algorithm.kl_ctrl.target_kl", "adaptive only"),
    "algorithm.state_masking.start_state_marker": _accepted("the Search-R1 task's observation tags",
        "<information>", only=("<information>",)),
    "algorithm.state_masking.end_state_marker": _accepted("the Search-R1 task's observation tags", "</information>",
        only=("</information>",)),
    # -- trainer
    "trainer.total_epochs": _accepted("sr1 stops after learner.total_steps; the prompts wrap around epochs", 30),
    "trainer.project_name": _same("logging.wandb_project", "", "verl_examples"),
    "trainer.experiment_name": _same("name", "also the run directory runs/<name>", "gsm8k"),
    "trainer.logger": Rule(("logging.wandb", "logging.wandb_mode"), "'wandb' in the list -> wandb online",
        ["console", "wandb"], _logger),
    "trainer.nnodes": _accepted(
        "sr1 places its pools by generators.num_engines x tensor_parallel_size and learner.num_ranks (Ray across "
        "nodes)", 1),
    "trainer.n_gpus_per_node": _accepted(
        "sr1 places its pools by generators.num_engines x tensor_parallel_size and learner.num_ranks", 8),
    "trainer.save_freq": Rule(("learner.checkpoint_every",),
        "-1: keep learner.checkpoint_every (sr1 always checkpoints: resuming needs it)", -1,
        _every("learner.checkpoint_every", None)),
    "trainer.test_freq": Rule(("eval.every_steps",), "-1 -> 0 (none during training)", -1,
        _every("eval.every_steps", 0)),
    "trainer.critic_warmup": Rule(("learner.algorithm.critic_warmup",), _CRITIC, 0,
        _ppo("learner.algorithm.critic_warmup")),
    "trainer.default_hdfs_dir": _accepted("sr1 does not upload checkpoints",
        "~/experiments/gsm8k/ppo/${trainer.experiment_name}"),
    "trainer.default_local_dir": _accepted("sr1 checkpoints into <run_dir>/checkpoints (run_dir: runs/<name>)",
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}"),
    "trainer.val_before_train": _accepted("`sr1 run` evaluates before training; `sr1 eval` any time"),
    "trainer.val_only": _accepted("evaluate with `sr1 eval`", only=(False,)),
    "max_turns": _same("generators.max_turns", "", 10),
    "do_search": _accepted("the Search-R1 task always offers the search tool", True, only=(True,)),
}
# fmt: on

# what verl fixes in code rather than in its config, and Search-R1's schedule: part of a whole script's translation
IMPLIED: dict[str, tuple[Any, str]] = {
    "learner.weight_decay": (0.01, "verl's AdamW weight decay (fixed in its FSDP workers)"),
    "learner.max_staleness": (0, "Search-R1 trains synchronously: each step's batch from the current policy"),
}
IMPLIED_PPO: dict[str, tuple[Any, str]] = {
    "learner.algorithm.critic.weight_decay": (0.01, "verl's AdamW weight decay for the critic"),
}


def verl_defaults() -> dict[str, Any]:
    """verl's trainer defaults, as Search-R1 ships them (`${...}` still unresolved)."""
    return {key: rule.default for key, rule in KEYS.items() if rule.default is not NO_DEFAULT}
