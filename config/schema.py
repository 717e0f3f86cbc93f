"""The root config: one pydantic-settings model with a section per pool.

Precedence, highest first: dotted CLI overrides (`learner.lr=1e-6`), environment variables
(`SR1_LEARNER__LR=1e-6`, `config/environment.py`), the YAML preset, the defaults below. Unknown keys anywhere are
errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from buffer.settings import BufferConfig
from buffer.staleness import largest_bound
from common.sections import DataConfig, EvalConfig, LoggingConfig, ModelConfig
from config.environment import ENV_NESTED_DELIMITER, ENV_PREFIX
from generators.job import GeneratorJob
from generators.settings import GeneratorsConfig
from learner.job import LearnerJob
from learner.settings import LearnerConfig
from retrieval.job import RetrievalJob
from retrieval.settings import RetrievalConfig
from tasks.settings import SearchR1Config, TaskConfig
from weight_sync.settings import WeightSyncConfig

# how far below learner.collective_timeout_s rank 0's bounded waits must end (the gathers around them take time too)
COLLECTIVE_MARGIN_S = 5.0


class _DictSource(PydanticBaseSettingsSource):
    """A settings source holding an already-parsed dict (the YAML preset)."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]):
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used instead
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self._values


class Config(BaseSettings):
    """Everything a run needs. Each process receives only the sections it uses (its role's `job.py`)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        validate_default=True,
    )

    name: str = Field("tiny", description="Run name; also the default run directory under runs/.")
    seed: int = Field(0, description="Seed for data order, model init of the tiny world, and sampling.")
    run_dir: Path | None = Field(None, description="Where the run writes everything (None: runs/<name>).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    task: TaskConfig = Field(
        default_factory=SearchR1Config, description="The RL task: its prompts, tool and reward (`tasks/`)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt datasets.")
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description="Retrieval server and client."
    )
    generators: GeneratorsConfig = Field(default_factory=GeneratorsConfig, description="Generator pool.")
    buffer: BufferConfig = Field(default_factory=BufferConfig, description="Redis replay buffer.")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="Learner pool and objective.")
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="Learner-to-engine weights."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Greedy evaluation on the test split.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics and logs.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _DictSource(settings_cls, _PRESET_VALUES.get()))

    @model_validator(mode="after")
    def _cross_section_invariants(self) -> Config:
        budget = self.model.max_prompt_tokens + self.generators.max_response_tokens
        if budget > self.model.max_seq_len:
            raise ValueError(
                f"model.max_prompt_tokens ({self.model.max_prompt_tokens}) + generators.max_response_tokens "
                f"({self.generators.max_response_tokens}) = {budget} exceeds model.max_seq_len ({self.model.max_seq_len})"
            )
        if self.learner.micro_batch_tokens < self.model.max_seq_len:
            raise ValueError(
                f"learner.micro_batch_tokens ({self.learner.micro_batch_tokens}) must be >= model.max_seq_len "
                f"({self.model.max_seq_len}) so that the longest trajectory fits in one packed micro-batch"
            )
        self._check_algorithm_shape()
        self._check_collective_timeout()
        if self.generators.lora.rank is not None and self.learner.lora is None:
            raise ValueError(
                "generators.lora.rank is set but learner.lora is not: the engines' adapter rank follows "
                "learner.lora.rank (set learner.lora instead)"
            )
        return self

    def _check_collective_timeout(self) -> None:
        """With several learner ranks, the others wait for rank 0 inside collectives that fail after
        learner.collective_timeout_s. Rank 0 holds them every 2 s while it waits or works alone, however long
        (learner/loop.py; its Redis calls there wait out an outage of any length), but two of its waits happen inside
        FSDP's gathers, unheld and bounded: a weight broadcast to a hung engine, and the Redis write that announces the
        update (it gives up after reconnect_s); each must end, with room to spare, before the collective does."""
        if self.learner.num_ranks < 2:
            return
        limit = self.learner.collective_timeout_s
        bounded = {
            f"weight_sync.timeout_s ({self.weight_sync.timeout_s:g} s)": self.weight_sync.timeout_s,
            f"buffer.reconnect_s + buffer.socket_timeout_s ({self.buffer.reconnect_s:g} s + "
            f"{self.buffer.socket_timeout_s:g} s)": self.buffer.reconnect_s + self.buffer.socket_timeout_s,
        }
        for what, seconds in bounded.items():
            if seconds > limit - COLLECTIVE_MARGIN_S:
                raise ValueError(
                    f"{what} must be at most learner.collective_timeout_s ({limit:g} s) - {COLLECTIVE_MARGIN_S:g} s "
                    f"with learner.num_ranks={self.learner.num_ranks}: the other learner ranks wait that long inside "
                    "a collective, which would time out first and restart the learner; raise "
                    "learner.collective_timeout_s or lower the other"
                )

    def _check_algorithm_shape(self) -> None:
        """The learner's update plan and DAPO's options against the generators' group size and token budget."""
        learner, group_size = self.learner, self.generators.group_size
        trajectories = learner.groups_per_step * group_size
        mini = learner.ppo_mini_batch_size
        if mini is not None and (mini > trajectories or trajectories % mini):
            raise ValueError(
                f"learner.ppo_mini_batch_size ({mini}) must divide the batch's trajectories: learner.groups_per_step "
                f"({learner.groups_per_step}) x generators.group_size ({group_size}) = {trajectories}"
            )
        algorithm = learner.algorithm
        if algorithm.group_baseline and group_size < 2:
            raise ValueError(
                f"learner.algorithm.type {algorithm.type} compares each sample with the others of its group: it "
                f"needs generators.group_size >= 2 (got {group_size}; ppo and reinforce_pp learn from one sample)"
            )
        critic_warmup = getattr(algorithm, "critic_warmup", 0)
        if critic_warmup >= learner.total_steps:
            raise ValueError(
                f"learner.algorithm.critic_warmup ({critic_warmup}) must be below learner.total_steps "
                f"({learner.total_steps}): the policy trains only after the critic's warmup"
            )
        if algorithm.dynamic_sampling and group_size < 2:
            raise ValueError(
                f"learner.algorithm.dynamic_sampling drops groups whose rewards are all equal: it needs "
                f"generators.group_size >= 2 (got {group_size})"
            )
        budget = self.generators.max_response_tokens
        if algorithm.overlong.buffer_tokens >= budget:
            raise ValueError(
                f"learner.algorithm.overlong.buffer_tokens ({algorithm.overlong.buffer_tokens}) must be below "
                f"generators.max_response_tokens ({budget})"
            )

    @property
    def resolved_run_dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else Path("runs") / self.name

    # -- each process's own config (each role's job.py) ---------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        return {"seed": self.seed, "run_dir": self.resolved_run_dir, "logging": self.logging}

    def generator_job(self, worker_id: str = "gen-0", engine_index: int = 0) -> GeneratorJob:
        return GeneratorJob(
            **self._common(),
            worker_id=worker_id,
            engine_index=engine_index,
            model=self.model,
            task=self.task,
            generators=self.engine_generators(),
            retrieval=self.retrieval,
            buffer=self.buffer,
            data=self.data,
            eval=self.eval,
        )

    def engine_generators(self) -> GeneratorsConfig:
        """The generators section as the engines need it: with `learner.lora`, LoRA on at the learner's rank and
        room for every adapter version a running request may still use (the largest staleness bound) plus the
        newest (docs/lora.md)."""
        lora = self.generators.lora
        if self.learner.lora is None:
            return self.generators
        max_loras = lora.max_loras or largest_bound(self.learner.max_staleness) + 2
        engine_lora = lora.model_copy(update={"rank": self.learner.lora.rank, "max_loras": max_loras})
        return self.generators.model_copy(update={"lora": engine_lora})

    def learner_job(self) -> LearnerJob:
        num_engines = self.learner.num_engines
        return LearnerJob(
            **self._common(),
            model=self.model,
            task=self.task,
            data=self.data,
            learner=self.learner,
            buffer=self.buffer,
            weight_sync=self.weight_sync,
            eval=self.eval,
            temperature=self.generators.temperature,
            max_response_tokens=self.generators.max_response_tokens,
            num_engines=self.generators.num_engines if num_engines is None else num_engines,
        )

    def retrieval_job(self) -> RetrievalJob:
        return RetrievalJob(**self._common(), retrieval=self.retrieval)


class _PresetHolder:
    """Hands the preset dict to settings_customise_sources (a classmethod without arguments)."""

    def __init__(self) -> None:
        self._value: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        return self._value

    def set(self, value: dict[str, Any]) -> None:
        self._value = value


_PRESET_VALUES = _PresetHolder()
