"""Secrets never leave the process: the one masking of passwords and tokens, for everything written or sent.

    mask_url("redis://sr1:pw@10.0.0.5:6379/0")            # redis://sr1:***@10.0.0.5:6379/0
    mask_config({"retrieval": {"token": "t0k"}})           # {"retrieval": {"token": "***"}}
    mask_argv(["sr1", "run", "retrieval.token=t0k"])       # ["sr1", "run", "retrieval.token=***"]
    mask_text("cannot reach redis://sr1:pw@h:6379/0")      # cannot reach redis://sr1:***@h:6379/0
    masked_leaves(job.model_dump(mode="json"))             # {"buffer.redis_url": "redis://sr1:pw@..."}: what it hid

What is a secret: the password of any URL (`scheme://user:password@host`), and the value of any field or option
whose name is `token`, `password`, `secret` or `api_key`, alone or as the end of a longer name (`hf_token`,
`retrieval.token`, `--token`, `SR1_RETRIEVAL__TOKEN`). A name that only contains one (`api_key_env`, which names a
variable, or `max_tokens`) is not a secret.

Every writer of a config or a command line goes through here: the wandb run's config and the command line wandb
records (`learner/tracking.py`), the run's `config.yaml` and each process's job file (`config/run_files.py`; a masked
job's secrets reach its process through the environment, `config/secret_env.py`), the run lock
(`sr1/launch/lock.py`), `sr1 config show`, and messages that name a URL (a failed search's reason,
`retrieval/http_json.py`; `buffer/connection.py`'s `mask_url` is this one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
SECRET_NAMES = ("token", "password", "secret", "api_key")

# scheme://user:password@ -- the password is everything between the colon and the last @ before the host
_URL_LOGIN = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*:)(?P<pw>[^\s'\"]*)(?P<at>@)")
_SECRET_WORD = r"[\w.-]*(?:token|password|secret|api[_-]?key)"
# NAME=VALUE or NAME: VALUE (an override, a variable, a YAML, JSON or log line, a query string), or `--NAME VALUE`
_QUOTE = "[\"']?"
_SEPARATOR = rf"{_QUOTE}(?:=|:[ \t]*){_QUOTE}|[ \t]+(?=[^\s-])"  # `=`, `: `, `": "`, or spaces before a value
_ASSIGNED = re.compile(
    rf"(?<![\w.-])(?P<name>-{{0,2}}{_SECRET_WORD})(?P<sep>{_SEPARATOR})(?P<value>[^\s,;&'\"}}]+)",
    re.IGNORECASE,
)


def is_secret_name(name: str) -> bool:
    """Whether a field, option or variable of this name holds a secret (`token`, `retrieval.token`, `--api-key`,
    `SR1_RETRIEVAL__TOKEN`, `hf_token`; not `api_key_env` nor `max_tokens`)."""
    last = re.split(r"\.|__", name.strip().lstrip("-"))[-1].lower().replace("-", "_")
    return any(last == s or last.endswith("_" + s) for s in SECRET_NAMES)


def mask_url(url: str) -> str:
    """`url` with its password replaced by `***` (`redis://sr1:***@host:6379/0`): what may be printed or logged."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urllib can split: mask any login it seems to hold
        return _URL_LOGIN.sub(lambda m: m["head"] + MASK + m["at"], url)
    login, at, host = parts.netloc.rpartition("@")
    user, colon, _password = login.partition(":")
    if not at or not colon:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def mask_text(text: str) -> str:
    """Free text (a command line, a log line, an error message) with every URL password and every value given to a
    secret's name (`retrieval.token=...`, `--token ...`, `SR1_RETRIEVAL__TOKEN=...`) replaced by `***`."""
    text = _URL_LOGIN.sub(lambda m: m["head"] + MASK + m["at"], text)

    def value(m: re.Match) -> str:
        if not is_secret_name(m["name"]) or m["value"] == MASK:
            return m[0]
        # a value after a space only for an option (`--token VALUE`): a bare word after "token" is prose
        if m["sep"].isspace() and not m["name"].startswith("--"):
            return m[0]
        return m["name"] + m["sep"] + MASK

    return _ASSIGNED.sub(value, text)


def mask_argv(argv: list[str]) -> list[str]:
    """A command line as it may be recorded: `--token VALUE`, `--token=VALUE`, `KEY=VALUE` overrides of secret
    keys and URL passwords masked, argument by argument."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        if arg.startswith("--") and "=" not in arg and is_secret_name(arg):
            hide_next = True
            out.append(arg)
            continue
        name, eq, _ = arg.partition("=")
        out.append(name + eq + MASK if eq and is_secret_name(name) else mask_text(arg))
    return out


def mask_config(data: Any) -> Any:
    """A config as plain data (`model_dump(mode="json")`, a YAML mapping) with every secret masked: the values of
    secret fields (when set) and the passwords of URLs in any string. A new object; `data` is left as it was."""
    if isinstance(data, Mapping):
        return {
            key: (MASK if value not in (None, "") else value)
            if is_secret_name(str(key)) and not isinstance(value, (Mapping, list))
            else mask_config(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [mask_config(v) for v in data]
    if isinstance(data, str):
        return mask_url(data) if "://" in data else data
    return data


def masked_leaves(data: Any, prefix: str = "") -> dict[str, str]:
    """The values `mask_config` hides in `data`, by dotted key (`{"buffer.redis_url": "redis://sr1:pw@..."}`):
    what a process given the masked config must get another way."""
    if isinstance(data, Mapping):
        items = [(str(key), value) for key, value in data.items()]
    elif isinstance(data, list):
        items = [(str(i), value) for i, value in enumerate(data)]
    else:
        return {}
    found: dict[str, str] = {}
    for key, value in items:
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, (Mapping, list)):
            found |= masked_leaves(value, path)
        elif isinstance(value, str) and mask_config({key: value})[key] != value:
            found[path] = value
    return found


def is_masked(value: Any) -> bool:
    """Whether `value` is a secret as `mask_config` leaves it (`***`, or a URL whose password is `***`)."""
    if not isinstance(value, str):
        return False
    if value == MASK:
        return True
    return "://" in value and mask_url(value) == value and f":{MASK}@" in value
