"""GenerateFeed (queueing/generate_feed.py) feeds a shard's rows in prefix order and puts
each output back at its own row: an engine stand-in records what it was given and
answers each request with its prompt, so a misplaced output shows."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import pyarrow as pa
import pytest

from engine.generate.options import GenerateOptions
from engine.generate.outputs import FinishedRequest, GenerationOutput
from queueing.generate_feed import GenerateFeed
from queueing.runtime import EngineKey
from queueing.worker import ShardWork


@dataclass
class RecordingEngine:
    """LLMEngine's streaming API over 'tokens are the characters' codes'."""

    options: GenerateOptions
    added: list[list[int]] = field(default_factory=list)        # prompts in the order they were added
    queued: dict[int, list[int]] = field(default_factory=dict)

    def prompt_token_ids(self, prompt):
        if not prompt:
            return "prompt is empty"
        return [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)

    def add_requests(self, prompts, params):
        assert len(prompts) == len(params)
        request_ids = []
        for prompt in prompts:
            tokens = self.prompt_token_ids(prompt)
            if isinstance(tokens, str):
                request_ids.append(tokens)
                continue
            self.added.append(tokens)
            request_ids.append(len(self.added) - 1)
            self.queued[len(self.added) - 1] = tokens
        return request_ids

    def step(self):
        finished = [FinishedRequest(request_id, GenerationOutput(token_ids=tokens, text="".join(map(chr, tokens)),
                                                                    finish_reason="length"))
                    for request_id, tokens in self.queued.items()]
        self.queued.clear()
        return finished


def _shard(inputs: list[str]) -> ShardWork:
    job = SimpleNamespace(spec=SimpleNamespace(params={"max_tokens": 4}))
    return ShardWork(job=job, claim=None, lease=None, shard=None, ids=pa.array(range(len(inputs)), pa.int64()),
                     inputs=inputs, carried={}, todo=list(range(len(inputs))))


def _run(order_by_prefix: bool, inputs: list[str], chunk: int) -> tuple[RecordingEngine, ShardWork]:
    llm = RecordingEngine(GenerateOptions(order_by_prefix=order_by_prefix))
    feed = GenerateFeed(SimpleNamespace(llm=llm), EngineKey("m", "generate"))
    work = _shard(inputs)
    while not work.is_fed:          # as the pipeline does: todo positions in order, a chunk at a time
        first_index = work.fed
        feed.add(work, work.take(chunk), first_index)
        feed.step()
    return llm, work


INPUTS = ["Translate: cat", "Summarize: long text", "", "Translate: dog", "Summarize: other", "Translate: cow",
          "Translate: cat"]


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_rows_are_fed_grouped_by_prefix_and_outputs_land_in_input_order(chunk):
    # When
    llm, work = _run(True, INPUTS, chunk)
    # Then: the Translate rows and the Summarize rows each come together...
    fed = ["".join(map(chr, tokens)) for tokens in llm.added]
    kinds = [text.split(":")[0] for text in fed]
    assert sorted(fed) == sorted(text for text in INPUTS if text)
    assert sum(1 for before, after in zip(kinds, kinds[1:]) if before != after) == 1
    # ...and every output is its own row's, the empty row's error included.
    assert [output.text for output in work.outputs[:2]] == INPUTS[:2]
    assert work.outputs[2].error == "prompt is empty"
    assert [output.text for output in work.outputs[3:]] == INPUTS[3:]


def test_without_prefix_order_rows_are_fed_as_they_come():
    llm, work = _run(False, INPUTS, 3)
    assert ["".join(map(chr, tokens)) for tokens in llm.added] == [text for text in INPUTS if text]
    assert [output.text for output in work.outputs if output.error is None] == [text for text in INPUTS if text]


def test_the_shards_lower_bound_counts_each_distinct_prefix_once():
    llm = RecordingEngine(GenerateOptions())
    feed = GenerateFeed(SimpleNamespace(llm=llm), EngineKey("m", "generate"))
    work = _shard(["abcx", "abcy", "abz"])
    feed.add(work, work.take(1), 0)
    assert feed.num_prefill_lower_bound == 6          # a b c x y z
    assert work.num_prefill_lower_bound == 6, "the shard carries its own bound to its usage"
    other = _shard(["abcx", "q"])
    feed.add(other, other.take(2), 0)
    assert (feed.num_prefill_lower_bound, other.num_prefill_lower_bound, work.num_prefill_lower_bound) == (11, 5, 6)


def test_rows_the_engine_refuses_when_queued_leave_the_shards_bound():
    # Given an engine that refuses prompts holding a "q" (as it refuses a row whose adapter cannot be read)
    class Refusing(RecordingEngine):
        def add_requests(self, prompts, params):
            return [super(Refusing, self).add_requests([prompt], [one])[0] if ord("q") not in prompt
                    else "adapter cannot be read" for prompt, one in zip(prompts, params)]
    feed = GenerateFeed(SimpleNamespace(llm=Refusing(GenerateOptions())), EngineKey("m", "generate"))
    work = _shard(["abcx", "qqqq", "abcy", "abz"])
    # When its rows are fed two at a time
    while not work.is_fed:
        first_index = work.fed
        feed.add(work, work.take(2), first_index)
        feed.step()
    # Then the refused row has its error and its tokens are not in the bound
    assert "cannot be read" in work.outputs[1].error
    assert work.num_prefill_lower_bound == feed.num_prefill_lower_bound == 6   # a b c x y z


def test_without_prefix_order_the_shards_bound_is_not_measured():
    _, work = _run(False, INPUTS, 3)
    assert work.num_prefill_lower_bound is None
