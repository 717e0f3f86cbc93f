"""`sr1 config`: show the resolved config of a preset with overrides, list presets, print the field reference.

sr1 config show [PRESET] [section.field=value ...]
sr1 config presets
sr1 config reference            # every field with its default and description (markdown)
sr1 config from-search-r1 train_grpo.sh [-o preset.yaml] [--base PRESET] [--env VAR=value ...]
sr1 config search-r1-keys       # docs/search-r1-keys.md: Search-R1's keys and what sr1 does with each
"""

from __future__ import annotations

import argparse
import re
import sys
import typing

from pydantic import BaseModel

from buffer.connection import mask_url
from config.loader import ConfigError, config_to_yaml, list_presets, load_config
from config.schema import Config
from config.search_r1_script import preset_yaml, search_r1_keys_doc, translate_script
from config.unions import section_models, union_tag


def _type_name(annotation: typing.Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    # module paths dropped: `buffer.auto_staleness.AutoStaleness` is `AutoStaleness`
    text = re.sub(r"\b[a-z_]+(\.[a-z_]+)*\.(?=[A-Z])", "", text)
    # a tagged union's members (`learner.max_staleness`): their types
    text = re.sub(r"Annotated\[(\w+), Tag\(tag='\w+'\)\]", r"\1", text)
    return text.replace("NoneType", "None")


def reference_rows(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every leaf field, depth first. A union section (`learner.correction`)
    gives its tag's row (every variant) and each variant's fields, marked with the variants that have them."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        models = section_models(field.annotation)
        tag = union_tag(field)
        if models and not tag:
            default = field.get_default(call_default_factory=True)
            # a value or a section (`learner.max_staleness`: 2 or {auto: ...}): its own row, then the section's
            if not isinstance(default, BaseModel):
                rows.append((key, _type_name(field.annotation), repr(default), field.description or ""))
            rows.extend(reference_rows(models[0], f"{key}."))
        elif models and tag:
            rows.extend(_union_rows(key, field, tag, models))
        else:
            default = field.get_default(call_default_factory=True)
            rows.append((key, _type_name(field.annotation), repr(default), field.description or ""))
    return rows


def _union_rows(
    key: str, field: typing.Any, tag_name: str, models: list[type[BaseModel]]
) -> list[tuple[str, str, str, str]]:
    tags = [m.model_fields[tag_name].default for m in models]
    default = getattr(field.get_default(call_default_factory=True), tag_name)
    rows = [(f"{key}.{tag_name}", " / ".join(repr(t) for t in tags), repr(default), field.description or "")]
    seen: dict[str, list[str]] = {}  # field -> the variants that have it
    for model, tag in zip(models, tags, strict=True):
        for name in model.model_fields:
            if name != tag_name:
                seen.setdefault(name, []).append(tag)
    for name, owners in seen.items():
        sub = next(m for m, t in zip(models, tags, strict=True) if t == owners[0]).model_fields[name]
        nested = section_models(sub.annotation)
        if nested and not union_tag(
            sub
        ):  # a section inside a variant (`learner.algorithm.critic`): its leaves
            for leaf, type_name, value, description in reference_rows(nested[0], f"{key}.{name}."):
                rows.append((leaf, type_name, value, f"({', '.join(owners)}) {description}"))
            continue
        value = repr(sub.get_default(call_default_factory=True))
        rows.append(
            (f"{key}.{name}", _type_name(sub.annotation), value, f"({', '.join(owners)}) {sub.description}")
        )
    return rows


def masked(cfg: Config) -> Config:
    """`cfg` as it may be shown: the Redis URL's password and the retrieval token replaced by `***`."""
    buffer = cfg.buffer.model_copy(
        update={"redis_url": cfg.buffer.redis_url and mask_url(cfg.buffer.redis_url)}
    )
    retrieval = cfg.retrieval.model_copy(update={"token": cfg.retrieval.token and "***"})
    return cfg.model_copy(update={"buffer": buffer, "retrieval": retrieval})


def reference_markdown() -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, type_name, default, description in reference_rows():
        cells = [f"`{key}`", type_name.replace("|", "or"), f"`{default}`", description.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sr1 config", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print the resolved config as YAML")
    show.add_argument("preset", nargs="?", default="tiny", help="preset name or YAML path (default: tiny)")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. learner.lr=1e-6")
    sub.add_parser("presets", help="list the presets in config/presets/")
    sub.add_parser("reference", help="print every config field (markdown table)")
    translate = sub.add_parser(
        "from-search-r1", help="translate a Search-R1 training script into an sr1 preset"
    )
    translate.add_argument(
        "script", help="a Search-R1 script with a `python -m verl.trainer.main_ppo` command"
    )
    translate.add_argument("-o", "--output", help="write the preset here (default: print it)")
    translate.add_argument(
        "--base",
        default="auto",
        help="preset holding sr1's machinery (default: sr1's Search-R1 preset of the script's "
        "estimator; 'none': sr1's defaults)",
    )
    translate.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="VAR=value",
        help="a variable the script uses but does not set",
    )
    sub.add_parser(
        "search-r1-keys", help="print docs/search-r1-keys.md (Search-R1's keys, rendered from the table)"
    )
    args = parser.parse_args(argv)

    if args.command == "from-search-r1":
        return _from_search_r1(args)
    if args.command == "search-r1-keys":
        print(search_r1_keys_doc(), end="")
    elif args.command == "presets":
        print("\n".join(list_presets()))
    elif args.command == "reference":
        print(reference_markdown())
    else:
        # a first positional that looks like an override belongs to the overrides
        preset, overrides = args.preset, list(args.overrides)
        if "=" in preset:
            preset, overrides = "tiny", [preset, *overrides]
        try:
            cfg = load_config(preset, overrides)
        except ConfigError as err:
            print(f"sr1 config: {err}", file=sys.stderr)
            return 2
        print(config_to_yaml(masked(cfg)), end="")
    return 0


def _from_search_r1(args: argparse.Namespace) -> int:
    from pathlib import Path

    env = dict(item.partition("=")[::2] for item in args.env)
    try:
        text = Path(args.script).read_text()
        translation = translate_script(text, None if args.base == "none" else args.base, env)
        output = preset_yaml(translation, args.script)
        if args.output:  # the preset must load: checked before it takes the output's name
            staged = Path(args.output).with_suffix(".staged.yaml")
            staged.write_text(output)
            try:
                load_config(staged)
                staged.replace(args.output)
            finally:
                staged.unlink(missing_ok=True)
    except OSError as err:
        print(f"sr1 config: {args.script}: {err}", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"sr1 config: {args.script}: {err}", file=sys.stderr)
        return 2
    if not args.output:
        print(output, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
