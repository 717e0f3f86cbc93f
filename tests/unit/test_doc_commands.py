"""Every command the docs show parses: each `sr1 …`, `python scripts/….py …`, `python -m …`, `torchrun … -m …` and
`make …` line in a code block of README.md, docs/ and the packages' READMEs goes through the real argument parser
of the command it names (nothing runs: parsing stops the command), so a renamed flag or subcommand fails here rather
than on a reader's machine. `make` lines must name targets of the Makefile. Dated measurement pages are records of
what was run then and are left out.

Placeholders readers fill in are allowed: an optional part in `[...]` is parsed as written out, `...` and `<...>` words
are dropped, `a|b` takes `a`, and a word in capitals (`N`, `PRESET`, `URL`) stands for a value (`1`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    p
    for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *ROOT.glob("*/README.md")]
    if ".venv" not in p.parts and "measurements" not in p.parts
)
# shell blocks (an untyped block shows output, such as error messages) and indented blocks
BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)
ANY_FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INDENTED = re.compile(r"(?:^(?: {4}|\t).*\n?)+", re.MULTILINE)
COMMAND = re.compile(
    r"^(sr1|torchrun|make)\s|^python3?\s+(-m\s|scripts/)"
)  # `python -c` is no command of sr1


def _blocks(text: str):
    """(line number of the block's first line, its lines) for every shell and indented block of a page."""
    for match in BLOCK.finditer(text):
        yield text.count("\n", 0, match.start()) + 2, match.group(1).splitlines()
    unfenced = ANY_FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keeps the line numbers
    for match in INDENTED.finditer(unfenced):
        yield unfenced.count("\n", 0, match.start()) + 1, match.group(0).splitlines()


def _commands() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        for first, lines in _blocks(page.read_text()):
            i = 0
            while i < len(lines):
                start, line = i, lines[i].strip()
                while line.endswith("\\") and i + 1 < len(lines):  # a command continued on the next line
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                i += 1
                for part in line.split("&&"):
                    part = part.strip()
                    if COMMAND.match(part):
                        found.append((str(page.relative_to(ROOT)), first + start, part))
    return found


COMMANDS = _commands()


def words(command: str) -> list[str]:
    """The command's words as a shell would pass them, with the docs' placeholders written out."""
    command = re.sub(
        r"\[([^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*)\](?=\s|$)", r"\1", command
    )  # `[--resume]` -> --resume
    argv = shlex.split(command, comments=True)
    if ">" in argv:
        argv = argv[: argv.index(">")]
    out = []
    for word in argv:
        if word in ("...", "…") or re.fullmatch(r"<[^>]*>", word):
            continue
        if re.fullmatch(r"[\w-]+(\|[\w-]+)+", word):
            word = word.split("|")[0]
        out.append("1" if re.fullmatch(r"[A-Z][A-Z_]{0,11}", word) else word)
    return out


class Parsed(Exception):
    """Raised once the command's own parser has accepted its arguments: nothing after parsing runs."""


@contextlib.contextmanager
def stop_after_parsing():
    """Every outermost `parse_known_args` (parse_args calls it) returns its result as `Parsed` instead."""
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_known_args(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            result = original(self, args, namespace)
        finally:
            depth -= 1
        if depth == 0:
            raise Parsed(result)
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original


def entry_point(argv: list[str]):
    """(main, its arguments) for a documented command line."""
    from sr1.cli import SUBCOMMANDS

    program, *rest = argv
    if program == "sr1":
        assert rest and rest[0] in SUBCOMMANDS, f"`sr1 {' '.join(rest[:1])}` is no subcommand of sr1"
        target = SUBCOMMANDS[rest[0]][0]
        module, _, function = target.partition(":")
        return getattr(importlib.import_module(module), function or "main"), rest[1:]
    if program == "torchrun":
        rest = rest[rest.index("-m") :]
    if rest[0] == "-m":
        return importlib.import_module(rest[1]).main, rest[2:]
    script = Path(rest[0])
    assert script.parts[0] == "scripts" and script.suffix == ".py", (
        f"not a script of this repository: {rest[0]}"
    )
    main = importlib.import_module(".".join(script.with_suffix("").parts)).main  # scripts is a package
    if not inspect.signature(main).parameters:  # a main that reads sys.argv itself
        return lambda args: _with_argv([rest[0], *args], main), rest[1:]
    return main, rest[1:]


def _with_argv(argv: list[str], main):
    saved, sys.argv = sys.argv, argv
    try:
        return main()
    finally:
        sys.argv = saved


def test_the_docs_show_commands_to_check():
    assert len(COMMANDS) >= 60, f"found {len(COMMANDS)} commands in {len(PAGES)} pages: is BLOCK still right?"


@pytest.mark.parametrize(("page", "line", "command"), COMMANDS, ids=[f"{p}:{n}" for p, n, _ in COMMANDS])
def test_documented_command_parses(page, line, command, capsys):
    argv = words(command)
    if argv[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
        named = [w for w in argv[1:] if "=" not in w and not w.startswith("-")]
        assert set(named) <= targets, f"{page}:{line}: no Makefile target {sorted(set(named) - targets)}"
        return
    main, args = entry_point(argv)
    with stop_after_parsing():
        try:
            main(args)
        except Parsed:
            return
        except SystemExit as exit_:
            if exit_.code:
                pytest.fail(
                    f"{page}:{line}: `{command}` is refused: {capsys.readouterr().err.strip()[-600:]}"
                )
            return  # --help and friends
    pytest.fail(f"{page}:{line}: `{command}` never reached an argument parser")


YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)
YAML_BLOCKS = [
    (str(page.relative_to(ROOT)), page.read_text().count("\n", 0, m.start()) + 2, m.group(1))
    for page in PAGES
    for m in YAML_BLOCK.finditer(page.read_text())
]


@pytest.mark.parametrize(("page", "line", "block"), YAML_BLOCKS, ids=[f"{p}:{n}" for p, n, _ in YAML_BLOCKS])
def test_documented_yaml_loads_as_a_config(page, line, block, tmp_path):
    """A YAML block of the docs is a part of a config file: laid over the tiny preset, it loads, every key known."""
    import yaml

    from config.loader import ConfigError, load_config, preset_path

    def laid_over(base: dict, part: dict) -> dict:
        merged = dict(base)
        for key, value in part.items():
            both_sections = isinstance(value, dict) and isinstance(base.get(key), dict)
            merged[key] = laid_over(base[key], value) if both_sections else value
        return merged

    tiny = yaml.safe_load(preset_path("tiny").read_text())
    path = tmp_path / "block.yaml"
    path.write_text(yaml.safe_dump(laid_over(tiny, yaml.safe_load(block))))
    try:
        load_config(path)
    except (ConfigError, ValueError) as error:
        pytest.fail(f"{page}:{line}: the YAML block does not load as a config: {error}")
