"""A Search-R1 training script (`train_ppo.sh`, `train_grpo.sh`) as an sr1 preset, and the key table as a document.

    sr1 config from-search-r1 train_grpo.sh -o my-grpo.yaml     # then: sr1 launch my-grpo.yaml
    sr1 config search-r1-keys > docs/search-r1-keys.md

The script's `python -m verl.trainer.main_ppo ...` command is read with its line continuations; `$VAR` / `${VAR}`
come from the script's own assignments (`export X=...`, `X=...`), then `--env`, then the environment. Its overrides
are layered over verl's trainer defaults (as Hydra does) and translated by `config/search_r1.py`; the preset is the
base preset's YAML (sr1's machinery: pools, GPUs, weight sync) with every translated value set and commented.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from config import search_r1, search_r1_keys
from config.loader import ConfigError, _fill_variant_types, _hydra_value, _read_yaml, load_config, preset_path
from config.migrate import migrate
from config.schema import Config

_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))")
_ENTRY = "verl.trainer.main_ppo"
_STOP = ("|", ">", "2>", "1>", "&", ";")
BASES = {"gae": "search-r1-ppo-8xh100", "grpo": "search-r1-grpo-8xh100"}


class ScriptError(ConfigError):
    """A script whose training command cannot be read; the message names the line."""


@dataclass
class ScriptOverrides:
    """The `key=value` overrides of a script's training command, with the line each is on."""

    values: dict[str, Any]
    lines: dict[str, int]
    tokens: list[
        str
    ]  # the overrides as the command passes them (variables expanded): what `sr1 config show` takes


@dataclass
class _Command:
    """One command of the script: its physical lines (number, text), backslash continuations joined."""

    lines: list[tuple[int, str]]

    @property
    def start(self) -> int:
        return self.lines[0][0]

    @property
    def text(self) -> str:
        return " ".join(text for _, text in self.lines)

    def line_of(self, token: str) -> int:
        """The physical line a token (or its key) is on."""
        for needle in (token, token.split("=", 1)[0]):
            for number, text in self.lines:
                if needle in text:
                    return number
        return self.start


def _commands(text: str) -> list[_Command]:
    out: list[_Command] = []
    pending: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.rstrip()
        continued = stripped.endswith("\\")
        pending.append((number, stripped[:-1] if continued else stripped))
        if not continued:
            out.append(_Command(pending))
            pending = []
    if pending:
        out.append(_Command(pending))
    return out


def _expand(token: str, variables: dict[str, str], line: int) -> str:
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise ScriptError(
                f"line {line}: ${name} is not set by the script (give it with --env {name}=...)"
            )
        return variables[name]

    return _VARIABLE.sub(value, token)


def _tokens(text: str, line: int) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError as err:
        raise ScriptError(f"line {line}: cannot parse {text.strip()[:80]!r}: {err}") from None


def parse_script(text: str, env: dict[str, str] | None = None) -> ScriptOverrides:
    """The overrides of the script's `python -m verl.trainer.main_ppo` command, variables expanded."""
    variables = {**os.environ, **(env or {})}
    for command in _commands(text):
        tokens = _tokens(command.text, command.start)
        if not tokens:
            continue
        assignment = _ASSIGNMENT.match(" ".join(tokens))
        if assignment and len(tokens) <= 2 and "-m" not in tokens:
            variables[assignment.group(1)] = _expand(assignment.group(2), variables, command.start)
            continue
        if _ENTRY in tokens:
            return _command_overrides(tokens, variables, command)
    raise ScriptError(f"no `python -m {_ENTRY}` command in the script")


def _command_overrides(tokens: list[str], variables: dict[str, str], command: _Command) -> ScriptOverrides:
    entry = tokens.index(_ENTRY)
    if entry < 2 or tokens[entry - 1] != "-m" or "python" not in Path(tokens[entry - 2]).name:
        raise ScriptError(
            f"line {command.line_of(_ENTRY)}: expected `python -m {_ENTRY}`, got "
            f"{' '.join(tokens[: entry + 1])!r}"
        )
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    expanded: list[str] = []
    for token in tokens[entry + 1 :]:
        if token.startswith(_STOP):
            break
        line = command.line_of(token)
        if "=" not in token:
            raise ScriptError(f"line {line}: cannot read {token!r} (expected key=value overrides)")
        expanded.append(_expand(token, variables, line))
        key, _, raw = expanded[-1].partition("=")
        key = key.lstrip("+")
        try:
            values[key] = _hydra_value(token, raw)
        except ConfigError as err:
            raise ScriptError(f"line {line}: {err}") from None
        lines[key] = line
    return ScriptOverrides(values, lines, expanded)


@dataclass
class ScriptTranslation:
    """A script's translation: the preset values, the comment of each translated key, the accepted keys."""

    preset: dict[str, Any]
    comments: dict[str, str]  # sr1 dotted key -> where it came from
    accepted: list[str]  # one line per key accepted without an sr1 field
    base: str | None


def translate_script(
    text: str, base: str | Path | None = "auto", env: dict[str, str] | None = None
) -> ScriptTranslation:
    """Translate a script onto `base` (a preset; "auto": sr1's Search-R1 preset of the script's estimator; None:
    sr1's defaults). Every key must be known; a value sr1 cannot take is an error naming the key and the line."""
    script = parse_script(text, env)
    unknown = [k for k in script.values if k not in search_r1_keys.KEYS]
    if unknown:
        hints = [f"line {script.lines[k]}: {k} ({search_r1.unknown_key_hint(k, [])})" for k in unknown]
        raise ScriptError("unknown Search-R1 keys:\n  " + "\n  ".join(hints))
    theirs = search_r1.resolve_interpolations(search_r1_keys.verl_defaults() | script.values)
    if base == "auto":
        base = BASES.get(theirs["algorithm.adv_estimator"])
    base_values = migrate(_read_yaml(preset_path(base)), str(base)) if base is not None else {}
    # sr1's defaults alone need not satisfy the cross-section checks: without a base, read them unchecked
    base_cfg = load_config(base) if base is not None else Config.model_construct()

    def lookup(dotted: str) -> Any:
        node: Any = base_cfg
        for part in dotted.split("."):
            node = getattr(node, part, None)
        return node

    try:
        translation = search_r1.translate(theirs, lookup)
    except search_r1.TranslationError as err:
        key = str(err).split("=", 1)[0]
        where = f"line {script.lines[key]}: " if key in script.lines else "verl's default: "
        raise ScriptError(f"{where}{err}") from None
    values = dict(translation.values)
    comments = {k: _comment(translation.origin[k], script, theirs) for k in values}
    implied = search_r1_keys.IMPLIED | (
        search_r1_keys.IMPLIED_PPO if values.get("learner.algorithm.type") == "ppo" else {}
    )
    for key, (value, why) in implied.items():
        values[key] = value
        comments[key] = why
    preset = base_values
    for key, value in values.items():
        _set(preset, key.split("."), value)
    _fill_variant_types(
        preset, {}
    )  # a union section the base does not give (task: format scores) names its type
    accepted = [note for key, note in translation.notes.items() if not search_r1_keys.KEYS[key].sets]
    return ScriptTranslation(preset, comments, accepted, None if base is None else str(base))


def _comment(their_key: str, script: ScriptOverrides, theirs: dict[str, Any]) -> str:
    where = f"line {script.lines[their_key]}" if their_key in script.lines else "verl default"
    return f"{their_key}={theirs[their_key]!r} ({where})"


def _set(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        node = target.get(key)
        if isinstance(node, str):  # a union section given by its variant name
            node = {"type": node}
        target[key] = node if isinstance(node, dict) else {}
        target = target[key]
    target[keys[-1]] = value


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _emit(node: dict[str, Any], comments: dict[str, str], prefix: str = "", indent: int = 0) -> list[str]:
    lines = []
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        pad = " " * indent
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            lines.extend(_emit(value, comments, f"{dotted}.", indent + 2))
            continue
        text = f"{pad}{key}: {_scalar(value)}"
        lines.append(f"{text}  # {comments[dotted]}" if dotted in comments else text)
    return lines


def preset_yaml(translation: ScriptTranslation, source: str) -> str:
    """The preset file: a header naming the script and base, the keys accepted without a field, then the values
    (each translated one commented with the Search-R1 key and line it came from)."""
    header = [
        f"# Translated from {source} by `sr1 config from-search-r1`; base preset: {translation.base or 'none'}",
        "# Search-R1 keys sr1 accepts without a field of its own (what sr1 does instead):",
    ]
    header += [f"#   {line}" for line in translation.accepted]
    return "\n".join([*header, *_emit(translation.preset, translation.comments)]) + "\n"


def search_r1_keys_doc() -> str:
    """`docs/search-r1-keys.md`: the key table rendered from `KEYS`, and what a whole script's translation sets."""
    rows = ["| Search-R1 / verl key | verl default | sr1 | note |", "|---|---|---|---|"]
    for key, rule in search_r1_keys.KEYS.items():
        default = "" if rule.default is search_r1_keys.NO_DEFAULT else f"`{rule.default!r}`"
        sets = ", ".join(f"`{s}`" for s in rule.sets) or "accepted"
        only = f" Only {' or '.join(repr(v) for v in rule.only)}." if rule.only is not None else ""
        rows.append(f"| `{key}` | {default} | {sets} | {(rule.note + only).strip().replace('|', '/')} |")
    implied = [
        f"| `{k}` | `{v!r}` | {why} |"
        for k, (v, why) in (search_r1_keys.IMPLIED | search_r1_keys.IMPLIED_PPO).items()
    ]
    return _KEYS_DOC.format(table="\n".join(rows), implied="\n".join(implied))


_KEYS_DOC = """# Search-R1's keys in sr1

Every key of Search-R1's (verl's) config that sr1 reads, its verl default, the sr1 key it sets and how. Generated from
`config/search_r1_keys.py` (`sr1 config search-r1-keys > docs/search-r1-keys.md`; a test checks that it is current); how to
use them: [coming from Search-R1](search-r1.md).

## The key table

{table}

## What a whole script also sets

`sr1 config from-search-r1 SCRIPT` also sets what verl fixes in code and Search-R1's schedule:

| sr1 key | value | why |
|---|---|---|
{implied}
"""
