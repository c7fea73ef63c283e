"""The yes/no reranker's prompt: Qwen3-Reranker's template, cut from the document's end to fit."""

from engine.score.rerank_prompt import DEFAULT_INSTRUCTION, PREFIX, SUFFIX, RerankPrompt, pair_text


def characters(text: str) -> list[int]:      # one token per character
    return [ord(character) for character in text]


def test_the_prompt_is_prefix_pair_suffix_with_the_default_instruction():
    prompt = RerankPrompt(characters, max_tokens=10_000)
    ids = prompt.token_ids(None, "what is a barge", "a flat boat", truncate=True)
    text = "".join(map(chr, ids))
    assert text == PREFIX + f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: what is a barge\n<Document>: a flat boat" + SUFFIX
    assert pair_text("Find boats", "q", "d") == "<Instruct>: Find boats\n<Query>: q\n<Document>: d"


def test_pairs_of_one_query_share_everything_before_the_document():
    prompt = RerankPrompt(characters, max_tokens=10_000)
    first = prompt.token_ids("task", "query", "first document", True)
    second = prompt.token_ids("task", "query", "another", True)
    shared = len(PREFIX) + len("<Instruct>: task\n<Query>: query\n<Document>: ")
    assert first[:shared] == second[:shared] and first[shared] != second[shared]


def test_a_long_pair_is_cut_from_its_end_and_refused_without_truncate():
    budget = len(PREFIX) + len(SUFFIX) + 60
    prompt = RerankPrompt(characters, max_tokens=budget)
    ids = prompt.token_ids("task", "query", "word " * 100, True)
    assert len(ids) == budget and ids[-len(SUFFIX):] == characters(SUFFIX)
    assert "".join(map(chr, ids)).startswith(PREFIX + "<Instruct>: task\n<Query>: query\n<Document>: word")
    error = prompt.token_ids("task", "query", "word " * 100, False)
    assert isinstance(error, str) and "refused because truncate=False" in error
