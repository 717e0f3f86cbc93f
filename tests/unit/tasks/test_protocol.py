"""The Search-R1 observation text, byte for byte what Search-R1's `_passages2string` writes."""

from retrieval.client import SearchResult
from tasks.search_r1.protocol import format_documents, information_block


def test_observations_are_search_r1_text():
    result = SearchResult(
        query="q",
        documents=[
            {"id": "1", "contents": '"Paris"\nParis is the capital.\nIt is big.'},
            {"id": "2", "contents": '"Nile"\nA river.'},
        ],
        scores=[2.0, 1.0],
    )
    # Search-R1's _passages2string keeps the first line as the title, quotes included
    assert (
        format_documents(result.documents, result.error)
        == 'Doc 1(Title: "Paris") Paris is the capital.\nIt is big.\nDoc 2(Title: "Nile") A river.'
    )


def test_an_observation_is_never_empty():
    assert format_documents([]) == "No documents found for this query."
    text = format_documents([], error="cannot reach the retrieval server at http://x/retrieve")
    assert text.startswith("Search unavailable: cannot reach") and text.endswith("Answer from what you know.")


def test_the_information_block_wraps_the_text_in_blank_lines():
    assert information_block("Doc 1(Title: x) y") == "\n\n<information>Doc 1(Title: x) y</information>\n\n"


async def test_the_baselines_answer_from_the_question_alone_or_with_documents_up_front():
    from tasks.search_r1 import SearchR1Task

    asked = []

    async def search(query: str) -> str:
        asked.append(query)
        return 'Doc 1(Title: "Cedar") The cedar is a tree.'

    task = SearchR1Task(search=search)
    direct = task.baseline_messages("what is a cedar", "direct")[0]["content"]
    assert direct.endswith("Question: what is a cedar?\n") and "<search>" not in direct
    context = await task.retrieve_context("what is a cedar")
    assert asked == ["what is a cedar?"] and context == 'Doc 1(Title: "Cedar") The cedar is a tree.'
    rag = task.baseline_messages("what is a cedar", "rag", context)[0]["content"]
    assert f"Documents:\n{context}\nQuestion: what is a cedar?\n" in rag and "<search>" not in rag
