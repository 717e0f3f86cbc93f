"""How a process gets the secrets its masked config file does not hold: through its environment.

A run's `config.yaml` and each process's job file are written with their secrets masked (`common/secrets.py`:
`buffer.redis_url`'s password, `retrieval.token`). A launcher hands each process it starts the values it masked as
the config's own variables (`SR1_BUFFER__REDIS_URL`, `SR1_RETRIEVAL__TOKEN`, config/environment.py), in that
process's environment only (never on its command line, which `ps` shows to everyone):

    job_file = save_job(job, run_dir / "jobs" / "learner.yaml")      # secrets masked
    Child("learner", cmd, env={**rank_env, **secret_env(job)})       # and given to the process here

and the process's `load_job` puts them back where its job file has `***` (`unmasked`). A secret that is masked and
not in the environment is a ConfigError naming the key and its variable (a resumed run: give it again).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from common.secrets import is_masked, masked_leaves
from config.environment import env_name


def secret_env(config: BaseModel) -> dict[str, str]:
    """The variables that carry what `config`'s file masks: `{"SR1_BUFFER__REDIS_URL": "redis://sr1:pw@..."}`."""
    return {env_name(key): value for key, value in masked_leaves(config.model_dump(mode="json")).items()}


def masked_keys(values: Any, prefix: str = "") -> list[str]:
    """The dotted keys of `values` (a config as plain data) whose value is a masked secret."""
    if not isinstance(values, Mapping):
        return []
    keys: list[str] = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            keys += masked_keys(value, path)
        elif is_masked(value):
            keys.append(path)
    return keys


def unmasked(
    values: dict[str, Any], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """`values` with each masked secret replaced by its variable's value from `environ` (default: this process's
    environment), and the keys of those whose variable is not set."""
    environ = os.environ if environ is None else environ
    values, missing = copy.deepcopy(values), []
    for key in masked_keys(values):
        given = environ.get(env_name(key))
        if given is None:
            missing.append(key)
            continue
        *sections, leaf = key.split(".")
        node = values
        for section in sections:
            node = node[section]
        node[leaf] = given
    return values, missing


def masked_message(keys: list[str], origin: str) -> str:
    """What a ConfigError says of secrets left masked: where, and how to give them again."""
    given = ", ".join(f"{key} ({env_name(key)})" for key in keys)
    return (
        f"{origin} holds the secret(s) {given} masked as *** (sr1 never writes a secret to disk): set the "
        "variable(s) named in this process's environment, or give the key(s) again as overrides"
    )
