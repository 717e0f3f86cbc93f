"""A second task, to show that adding one touches nothing but the task: arithmetic with a calculator tool.

The model asks `<calc> 17 * 23 </calc>`, sees `<result> 391 </result>`, and answers `<final> 391 </final>`.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Iterable
from pathlib import Path

from buffer.records import PromptRecord, make_group_id
from tasks.base import Action, Observation, Score, Task, Transcript

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> int:
    """+, - and * over integers; anything else is a ValueError."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"cannot calculate {expression!r}")

    return value(ast.parse(expression.strip(), mode="eval").body)


class ArithmeticTask(Task):
    name = "arithmetic"
    stop_strings = ("</calc>", "</final>")

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Use <calc> for arithmetic, answer in <final>. {question}"}]

    def load_prompts(
        self, paths: Path | str | Iterable[Path | str], *, split=None, epoch=0
    ) -> list[PromptRecord]:
        questions = [
            line.split("=")
            for p in ([paths] if isinstance(paths, (str, Path)) else paths)
            for line in Path(p).read_text().splitlines()
            if line
        ]
        return [
            PromptRecord(
                make_group_id("arith", split or "train", i, epoch),
                q,
                self.prompt_messages(q),
                [a.strip()],
                "arith",
                i,
                split or "train",
            )
            for i, (q, a) in enumerate(questions)
        ]

    def parse_action(self, turn_text: str) -> Action:
        for kind, tag in (("tool", "calc"), ("answer", "final")):
            if f"<{tag}>" in turn_text and f"</{tag}>" in turn_text:
                return Action(kind, turn_text.split(f"<{tag}>")[1].split(f"</{tag}>")[0].strip())
        return Action("invalid")

    async def call_tool(self, tool_input: str) -> Observation:
        try:
            return Observation(f" <result> {calculate(tool_input)} </result> ", keep_tail=" </result> ")
        except (ValueError, SyntaxError) as err:
            return Observation(f" <result> error: {err} </result> ", keep_tail=" </result> ", failed=True)

    def invalid_action(self) -> Observation:
        return Observation(" Use <calc> or <final>. ")

    def score(self, transcript: Transcript, ground_truth: list[str]) -> Score:
        action = self.parse_action(transcript.turn_texts[-1]) if transcript.turn_texts else Action("invalid")
        correct = action.kind == "answer" and action.content in ground_truth
        return Score(float(correct), {"correct": float(correct)})
