"""The Search-R1 protocol: the prompt template, the action grammar and the observation texts.

The strings here are what a policy trained with Search-R1 (PeterGriffinJin/Search-R1) expects, byte for byte: the
instruction that precedes the question (its `nq_search.py` "base" template), `<search> query </search>` /
`<answer> text </answer>` actions, results appended as `\\n\\n<information>{docs}</information>\\n\\n` with one
`Doc {i}(Title: {title}) {text}` line per passage (its `_passages2string`), and the "My previous action is invalid"
message for a turn that neither searches nor answers.
"""

from __future__ import annotations

import re

STOP_STRINGS = ("</search>", "</answer>")

# The instruction of Search-R1's `nq_search.py` (template "base"); the question follows `Question: `.
INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query "
    "</search> and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: "
)

# The two baselines of the Search-R1 paper's tables, answering in one turn: no retrieval, and retrieval up front (RAG).
# sr1's own wording, kept as close to INSTRUCTION as the setting allows so that only the search differs.
DIRECT_INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: "
)
RAG_INSTRUCTION = (
    "Answer the given question using the documents below where they help. "
    "You must conduct reasoning inside <think> and </think> first. "
    "Then provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>."
)

INVALID_ACTION = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

INFORMATION_OPEN = "\n\n<information>"
INFORMATION_CLOSE = "</information>\n\n"

# The first complete action of a turn; the engine stops at the first closing tag, so there is at most one.
_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# One well-formed turn: reasoning, then exactly one action, nothing else around them.
_WELL_FORMED_TURN = re.compile(
    r"\s*<think>(?:(?!<think>|</think>).)*</think>\s*<(search|answer)>(.*?)</\1>\s*", re.DOTALL
)


def normalize_question(question: str) -> str:
    """Search-R1's question clean-up: strip, and end with a question mark."""
    question = question.strip()
    if question and not question.endswith("?"):
        question += "?"
    return question


def make_prompt_text(question: str) -> str:
    """The user message of Search-R1's prompt for `question` (the instruction, the question, a newline)."""
    return f"{INSTRUCTION}{normalize_question(question)}\n"


def make_prompt_messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": make_prompt_text(question)}]


def make_direct_messages(question: str) -> list[dict[str, str]]:
    """The direct-inference baseline's prompt: the question, no search."""
    return [{"role": "user", "content": f"{DIRECT_INSTRUCTION}{normalize_question(question)}\n"}]


def make_rag_messages(question: str, documents: str) -> list[dict[str, str]]:
    """The RAG baseline's prompt: the documents retrieved for the question, then the question."""
    content = f"{RAG_INSTRUCTION}\nDocuments:\n{documents}\nQuestion: {normalize_question(question)}\n"
    return [{"role": "user", "content": content}]


def parse_action(text: str) -> tuple[str | None, str]:
    """`("search", query)`, `("answer", text)` or `(None, "")` for one turn's sampled text."""
    match = _ACTION_RE.search(text)
    if match is None:
        return None, ""
    return match.group(1), match.group(2).strip()


def extract_answer(text: str) -> str | None:
    """The last `<answer>` of a response (Search-R1 scores the last one), or None."""
    answers = _ANSWER_RE.findall(text)
    return answers[-1].strip() if answers else None


def is_well_formed_turn(text: str) -> bool:
    """True for a turn of the form `<think> ... </think> <search|answer> ... </search|answer>`."""
    return _WELL_FORMED_TURN.fullmatch(text) is not None


# -- observations ---------------------------------------------------------------------------------------------------


def _title_text(contents: str) -> tuple[str, str]:
    # Search-R1's own parsing: the first line is the title as stored (quotes included), the rest is the text
    first, _, rest = contents.partition("\n")
    return first, rest


def format_documents(documents: list[dict], error: str | None = None) -> str:
    """The text inside `<information>`: `Doc {i}(Title: {title}) {text}` per document, one per line; never empty.

    The title is the first line of `contents` exactly as Search-R1's `_passages2string` takes it (with the corpus's
    double quotes), so a policy trained with Search-R1 sees the same bytes. A failed search says why ("Search
    unavailable: ...") rather than leaving the block empty.
    """
    if error is not None:
        return f"Search unavailable: {error.rstrip('. ')}. Answer from what you know."
    if not documents:
        return "No documents found for this query."
    lines = []
    for i, doc in enumerate(documents, start=1):
        title, text = _title_text(str(doc.get("contents", "")))
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


def information_block(text: str) -> str:
    """The observation appended after a search: the results wrapped in the information tags, blank lines around."""
    return f"{INFORMATION_OPEN}{text}{INFORMATION_CLOSE}"


# -- turns (what a well-formed model turn looks like; the tiny world's warm start writes these) ---------------------


def search_turn(thought: str, query: str) -> str:
    return f"<think> {thought} </think> <search> {query} </search>"


def answer_turn(answer: str, thought: str | None = None) -> str:
    reasoning = f"<think> {thought} </think> " if thought else ""
    return f"{reasoning}<answer> {answer} </answer>"
