"""sr1's environment variables: `SR1_` + a config key, its sections joined by `__`, override the preset.

    SR1_LEARNER__LR=1e-6                      learner.lr
    SR1_RETRIEVAL__TOKEN=...                  retrieval.token (`sr1 retrieval serve` also takes it without --config)
    SR1_BUFFER__REDIS_URL=redis://h:6379/0    buffer.redis_url (`sr1 buffer` reads it too)

Every `SR1_*` variable is a config key, so one that names none is an error naming the variable, with the spelling
it probably meant when there is one (`SR1_LEARNER_LR` is `SR1_LEARNER__LR`): a typo never leaves a setting silently
at its default. The only other `SR1_*` names are the few variables sr1 sets for its own child processes, listed in
`NOT_CONFIG`; the config neither reads them nor refuses them, and a test keeps every `SR1_*` name in the code in one
of the two groups.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from common.heap import KEEP_FREED_ENV
from common.launcher import LAUNCHER_ENV
from generators.engine import DIE_WITH_PARENT_ENV

ENV_PREFIX = "SR1_"
ENV_NESTED_DELIMITER = "__"

# sr1's variables that are not config keys -> who sets them, for whom
NOT_CONFIG: dict[str, str] = {
    DIE_WITH_PARENT_ENV: "a generator worker, for its vLLM engine's processes (generators/engine.py)",
    KEEP_FREED_ENV: "a user or scripts/bench/worker_memory.py: processes keep their freed heap pages (common/heap.py)",
    LAUNCHER_ENV: "a launcher holding the run lock, for the learner it starts (common/launcher.py)",
}


def env_name(key: str) -> str:
    """The environment variable of a dotted config key: `retrieval.token` -> `SR1_RETRIEVAL__TOKEN`."""
    return ENV_PREFIX + key.upper().replace(".", ENV_NESTED_DELIMITER)


def config_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names in `environ` (default: this process's environment) that the config reads: every `SR1_*` name
    (in any case, as pydantic-settings matches them) except sr1's own `NOT_CONFIG` ones."""
    environ = os.environ if environ is None else environ
    return [
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX)
        and name.upper() != ENV_PREFIX
        and name.upper() not in NOT_CONFIG
    ]


def meant_key(name: str, keys: Iterable[str]) -> str | None:
    """The one of the dotted `keys` whose variable `name` spells with single underscores between its sections
    (`SR1_RETRIEVAL_TOKEN` means `retrieval.token`), or None."""
    flat = name.upper().replace(ENV_NESTED_DELIMITER, "_")
    return next((key for key in keys if env_name(key).replace(ENV_NESTED_DELIMITER, "_") == flat), None)
