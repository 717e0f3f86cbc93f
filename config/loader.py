"""Build a `Config` from a preset, the environment and dotted overrides, and write it into a run directory.

    cfg = load_config("tiny", ["learner.lr=1e-6", "generators.group_size=4"])

A preset is a name in `config/presets/` (without `.yaml`) or a path to a YAML file. Override values are parsed as
YAML scalars/lists (`true`, `3`, `1e-6`, `[a, b]`). Unknown keys and bad values raise `ConfigError` naming the key.
Overrides may also use Search-R1's (verl's) keys, `actor_rollout_ref.actor.optim.lr=1e-6`: they are translated by
`config/search_r1.py`; where both spellings set one field, the sr1 key wins.
"""

from __future__ import annotations

import copy
import difflib
import logging
import re
import threading
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from config import search_r1, search_r1_keys
from config.environment import ENV_NESTED_DELIMITER, ENV_PREFIX, config_variables, env_name, meant_key
from config.migrate import migrate, renamed_key
from config.run_files import config_to_yaml, save_config, save_job, write_private  # noqa: F401 (imported from here)
from config.schema import _PRESET_VALUES, Config
from config.secret_env import masked_keys, masked_message, unmasked
from config.strict import boolean_numbers, non_finite_numbers
from config.unions import section_models, union_tag
from generators.job import GeneratorJob
from learner.job import LearnerJob
from retrieval.job import RetrievalJob

log = logging.getLogger("config")
PRESETS_DIR = Path(__file__).parent / "presets"
JobT = typing.TypeVar("JobT", bound=BaseModel)
_LOCK = threading.Lock()


class ConfigError(ValueError):
    """A config that cannot be built: unknown key, bad value, broken invariant, missing preset."""


EXIT_BAD_INPUT = 78
"""The exit status of a process stopped by a configuration or data error (sysexits' EX_CONFIG). Running it again
gives the same error, so supervisors never restart a process that exits with it (sr1/launch/supervisor.py)."""

EXIT_CHECKPOINT_FAILED = 74
"""The exit status of a learner that stopped because its checkpoints cannot be written (sysexits' EX_IOERR): two in
a row failed (a full disk). A restart would fail the same way until someone frees space, so supervisors do not
restart it; `--resume` goes on from the last good checkpoint once there is room (learner/checkpoints/safety_net.py)."""


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(preset: str | Path) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    candidate = PRESETS_DIR / f"{preset}.yaml"
    if not candidate.is_file():
        raise ConfigError(
            f"unknown preset {preset!r}; available: {', '.join(list_presets())} (or a path to a .yaml file)"
        )
    return candidate


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}"
        )
    return data


def _fields_of(models: list[type[BaseModel]]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for model in models:
        for name, field in model.model_fields.items():
            fields.setdefault(name, field)
    return fields


def _check_key_path(keys: list[str], origin: str, root: type[BaseModel] = Config) -> None:
    """Raise a ConfigError naming the first unknown key of a dotted path, with close matches."""
    models: list[type[BaseModel]] = [root]
    for depth, key in enumerate(keys):
        fields = _fields_of(models)
        if key not in fields:
            dotted = ".".join(keys[: depth + 1])
            close = difflib.get_close_matches(key, list(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known keys: {', '.join(fields)}"
            theirs = search_r1.unknown_key_hint(".".join(keys), [])
            hint += f"; {theirs}" if theirs else ""
            raise ConfigError(f"{origin}: unknown config key {dotted!r}{hint}")
        if depth + 1 < len(keys):
            models = section_models(fields[key].annotation)
            if not models:
                raise ConfigError(f"{origin}: {'.'.join(keys[: depth + 1])!r} is a value, not a section")


def _normalize(values: dict[str, Any], model: type[BaseModel] = Config) -> dict[str, Any]:
    """A union section given by its variant's name alone (`correction: icepop`) becomes `{"type": "icepop"}` (its
    tag: `retriever: dense` becomes `{"method": "dense"}`), so that a later source's `correction.cap` merges into it
    instead of replacing it."""
    fields = model.model_fields
    for key, value in values.items():
        if key not in fields:
            continue
        models = section_models(fields[key].annotation)
        tag = union_tag(fields[key])
        if isinstance(value, str) and tag:
            values[key] = {tag: value}
        elif isinstance(value, dict) and not tag and models:
            _normalize(value, models[0])
    return values


def _fill_variant_types(
    update: dict[str, Any], base: dict[str, Any], model: type[BaseModel] = Config
) -> None:
    """A union section an override sets without its tag (`task.reward=f1`) keeps the variant the lower source gives,
    else takes the field's default variant."""
    fields = model.model_fields
    for key, value in update.items():
        if key not in fields or not isinstance(value, dict):
            continue
        models = section_models(fields[key].annotation)
        below = base.get(key) if isinstance(base.get(key), dict) else {}
        tag = union_tag(fields[key])
        if tag:
            if tag not in value and tag not in below:
                value[tag] = getattr(fields[key].get_default(call_default_factory=True), tag)
        elif models:
            _fill_variant_types(value, below, models[0])


def _set_dotted(target: dict[str, Any], keys: list[str], value: Any, root: type[BaseModel]) -> None:
    models = [root]
    for key in keys[:-1]:
        field = _fields_of(models)[key]  # the path is checked before
        models = section_models(field.annotation)
        node = target.setdefault(key, {})
        if not isinstance(
            node, dict
        ):  # `correction=icepop correction.low=0.3`: the shorthand, then one of its knobs
            tag = union_tag(field)
            node = target[key] = {tag: node} if isinstance(node, str) and tag else {}
        target = node
    target[keys[-1]] = value


def _parse_value(item: str, raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {item!r}: cannot parse value {raw!r}: {err}") from err


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _hydra_value(item: str, raw: str) -> Any:
    """A Search-R1 override's value as Hydra reads it: YAML, and `1e-6` a number (YAML 1.1 reads it as text)."""
    value = _parse_value(item, raw)
    return float(value) if isinstance(value, str) and _FLOAT.match(value) else value


def parse_overrides(overrides: list[str], root: type[BaseModel] = Config) -> dict[str, Any]:
    """`["learner.lr=1e-6", "seed=3"]` -> `{"learner": {"lr": 1e-6}, "seed": 3}` with keys checked against `root`."""
    result: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        current = renamed_key(dotted.strip(), f"override {item!r}")
        if current is None:  # a key that is gone (it did nothing)
            continue
        keys = current.split(".")
        _check_key_path(keys, f"override {item!r}", root)
        _set_dotted(result, keys, _parse_value(item, raw), root)
    return _normalize(result, root)


def leaf_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted leaf key of `model` (union sections: every variant's fields)."""
    keys = []
    for name, fld in _fields_of([model]).items():
        models = section_models(fld.annotation)
        if models:
            keys.extend(k for m in models for k in leaf_keys(m, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return list(dict.fromkeys(keys))


def _check_value(keys: list[str], value: Any, root: type[BaseModel]) -> None:
    """Validate one value against its field (against each variant's, in a union section: one must take it)."""
    models: list[type[BaseModel]] = [root]
    for key in keys[:-1]:
        models = section_models(_fields_of(models)[key].annotation)
    errors = []
    for model in models:
        fld = model.model_fields.get(keys[-1])
        if fld is None:
            continue
        annotation = typing.Annotated[(fld.annotation, *fld.metadata)] if fld.metadata else fld.annotation
        try:
            TypeAdapter(annotation).validate_python(value)
            return
        except ValidationError as err:
            errors.append("; ".join(e["msg"] for e in err.errors()))
    raise ValueError(errors[0])


def _split_search_r1(
    overrides: list[str], root: type[BaseModel]
) -> tuple[list[str], dict[str, tuple[str, Any]]]:
    """sr1's own overrides, and Search-R1's keys -> (the override as given, its parsed value)."""
    native: list[str] = []
    theirs: dict[str, tuple[str, Any]] = {}
    for item in overrides:
        dotted, _, raw = item.partition("=")
        dotted = dotted.strip()
        if search_r1.is_search_r1_key(dotted):
            theirs[dotted.lstrip("+")] = (item, _hydra_value(item, raw))
        elif search_r1.looks_like_search_r1(dotted) and dotted.split(".")[0] not in root.model_fields:
            hint = search_r1.unknown_key_hint(dotted, leaf_keys(root))
            raise ConfigError(
                f"override {item!r}: unknown config key {dotted!r}" + (f"; {hint}" if hint else "")
            )
        else:
            native.append(item)
    return native, theirs


def _translate(theirs: dict[str, tuple[str, Any]], root: type[BaseModel], build_base) -> dict[str, Any]:
    """The nested sr1 values of Search-R1 overrides; `build_base()` gives the config below them (built only when a
    rule needs a value from it). A value of the wrong type names both spellings of its key."""
    base: list[BaseModel] = []

    def lookup(dotted: str) -> Any:
        if not base:
            base.append(build_base())
        node: Any = base[0]
        for part in dotted.split("."):
            node = getattr(node, part, None)
        return node

    try:
        translation = search_r1.translate({k: v for k, (_, v) in theirs.items()}, lookup)
    except search_r1.TranslationError as err:
        raise ConfigError(f"override {err}") from None
    for key, note in translation.notes.items():
        if not search_r1_keys.KEYS[key].sets:  # the knob does nothing here: say what sr1 does instead
            log.warning("override %r: %s", theirs[key][0], note)
    result: dict[str, Any] = {}
    for sr1_key, value in translation.values.items():
        item = theirs[translation.origin[sr1_key]][0]
        keys = sr1_key.split(".")
        _check_key_path(keys, f"override {item!r} (sr1: {sr1_key})", root)  # a job has some sections only
        try:
            _check_value(keys, value, root)
        except ValueError as err:
            raise ConfigError(f"override {item!r} (sr1: {sr1_key}={value!r}): {err}") from None
        _set_dotted(result, keys, value, root)
    return _normalize(result, root)


def _check_env() -> None:
    """Every SR1_* variable names a config key (config/environment.py); a ConfigError names the first that does not."""
    for name in config_variables():
        keys = name[len(ENV_PREFIX) :].lower().split(ENV_NESTED_DELIMITER)
        try:
            _check_key_path(keys, f"environment variable {name}")
        except ConfigError:
            key = meant_key(name, leaf_keys())
            if key is None:
                raise
            raise ConfigError(
                f"environment variable {name} is not a config key: sections are joined by "
                f"{ENV_NESTED_DELIMITER!r}, so {key} is {env_name(key)}"
            ) from None


def _check_yaml_keys(
    data: dict[str, Any], origin: str, root: type[BaseModel] = Config, prefix: list[str] | None = None
) -> None:
    prefix = prefix or []
    for key, value in data.items():
        keys = [*prefix, str(key)]
        _check_key_path(keys, origin, root)
        models: list[type[BaseModel]] = [root]
        for k in keys:
            models = section_models(_fields_of(models)[k].annotation)
        if isinstance(value, dict) and models:
            _check_yaml_keys(value, origin, root, keys)


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "config"
        got = item.get("input")
        got_text = f" (got {got!r})" if not isinstance(got, dict) else ""
        lines.append(f"  {where}: {item['msg']}{got_text}")
    return "invalid config:\n" + "\n".join(lines)


def _refuse(problems: list[str]) -> None:
    """One ConfigError listing every problem, one line each (the shape of a validation error's message)."""
    if problems:
        raise ConfigError("invalid config:\n" + "\n".join(f"  {p}" for p in problems))


def _strictly(build: typing.Callable[[], JobT], *raw: tuple[dict[str, Any], type[BaseModel], str]) -> JobT:
    """`build()`, refusing booleans given for numbers in the raw values (each with its model and where it came
    from) before, and non-finite numbers after (config/strict.py)."""
    _refuse([f"{origin}: {p}" for values, model, origin in raw for p in boolean_numbers(values, model)])
    try:
        built = build()
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None
    _refuse(non_finite_numbers(built))
    return built


def load_config(preset: str | Path | None = "tiny", overrides: list[str] | None = None) -> Config:
    """The resolved config: defaults < preset YAML < SR1_* environment < dotted overrides."""
    preset_values: dict[str, Any] = {}
    if preset is not None:
        path = preset_path(preset)
        preset_values = _normalize(migrate(_read_yaml(path), str(path)))
        _check_yaml_keys(preset_values, str(path))
    _check_env()
    origin = str(path) if preset is not None else "defaults"
    native, theirs = _split_search_r1(overrides or [], Config)
    cli_values = parse_overrides(native)
    if theirs:
        translated = _translate(
            theirs, Config, lambda: _build(preset_values, copy.deepcopy(cli_values), origin)
        )
        cli_values = _deep_merge(translated, cli_values)  # sr1's own keys win
    cfg = _build(preset_values, cli_values, origin)
    # a run's config.yaml holds its secrets masked: they come again from SR1_* variables or overrides
    masked = masked_keys(cfg.model_dump(mode="json"))
    if masked:
        raise ConfigError(masked_message(masked, origin))
    return cfg


def _build(preset_values: dict[str, Any], cli_values: dict[str, Any], origin: str) -> Config:
    """The root config from a preset's values (read from `origin`) and the parsed overrides."""
    _fill_variant_types(cli_values, preset_values)
    with _LOCK:  # the preset reaches the settings source through a module-level holder
        _PRESET_VALUES.set(preset_values)
        try:
            return _strictly(
                lambda: Config(**cli_values),
                (preset_values, Config, origin),
                (cli_values, Config, "override"),
            )
        finally:
            _PRESET_VALUES.set({})


# -- each process's own config (each role's job.py) --------------------------------------------------------------------


def load_job(job_cls: type[JobT], config: str | Path | None, overrides: list[str] | None = None) -> JobT:
    """A process's typed config from `config`: a job file a launcher wrote (its `job:` names the kind), or a
    preset / root config file, from which the root config makes the job; None: the job's defaults. Dotted overrides
    apply either way."""
    kind = job_cls.model_fields["job"].default
    path = Path(config if config is not None else "defaults")
    if config is None:
        values: dict[str, Any] | None = {"job": kind}
    else:
        values = _read_yaml(path) if path.suffix in (".yaml", ".yml") and path.is_file() else None
    if values is None or "job" not in values:
        root = load_config(config, overrides)
        makers = {
            GeneratorJob: root.generator_job,
            LearnerJob: root.learner_job,
            RetrievalJob: root.retrieval_job,
        }
        return makers[job_cls]()
    if values["job"] != kind:
        raise ConfigError(f"{path} is the job file of a {values['job']} process, not of a {kind} process")
    values = migrate(values, str(path))
    _check_yaml_keys(values, str(path), job_cls)
    values = _normalize(values, job_cls)
    native, theirs = _split_search_r1(overrides or [], job_cls)
    update = parse_overrides(native, job_cls)
    if theirs:
        translated = _translate(
            theirs, job_cls, lambda: _build_job(job_cls, values, copy.deepcopy(update), path)
        )
        update = _deep_merge(translated, update)
    return _build_job(job_cls, values, update, path)


def _build_job(job_cls: type[JobT], values: dict[str, Any], update: dict[str, Any], path: Path) -> JobT:
    """A job config from its file's values (read from `path`) and the parsed overrides."""
    _fill_variant_types(update, values, job_cls)
    merged, masked = unmasked(_deep_merge(values, update))  # the secrets its launcher put in its environment
    if masked:
        raise ConfigError(masked_message(masked, str(path)))
    return _strictly(lambda: job_cls(**merged), (values, job_cls, str(path)), (update, job_cls, "override"))


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
