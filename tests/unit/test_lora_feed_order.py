"""A LoRA job's rows in waves (engine/lora/waves.py, queueing/generate_feed.py) and the next
wave's adapters read ahead (LoraManager.prefetch): the order as a table, the feed over an
engine stand-in that records what it was given and answers each request with its prompt
(so a misplaced output shows), the host cache filled by the prefetch thread on tiny random
PEFT adapters, and a real small engine fed a shard of four adapters and the base."""

import shutil
from concurrent import futures
from dataclasses import dataclass, field
from types import SimpleNamespace

import pyarrow as pa
import pytest
import torch

from engine.generate.options import GenerateOptions
from engine.generate.outputs import FinishedRequest, GenerationOutput
from engine.generate.prefix_order import plan_prefix_order
from engine.lora.waves import Wave, WavePlan, adapter_waves, plan_wave_order
from queueing.generate_feed import GenerateFeed
from queueing.runtime import EngineKey
from queueing.worker import ShardWork


def tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


# -- the order, as a table ---------------------------------------------------------------

@pytest.mark.parametrize("keys, max_loras, running, expected", [
    (list("ABCDAEBFCGDH"), 4, (), [("A", "B", "C", "D"), ("E", "F", "G", "H")]),
    (list("ABAB"), 4, (), [("A", "B")]),                                    # one wave
    (["A", None, "B", "C", None, "A"], 2, (), [("A", "B"), ("C",)]),        # the base is in no wave
    (list("ABCDE"), 2, ("D", "Z", "C"), [("D", "C"), ("A", "B"), ("E",)]),  # running adapters first, if named
    ([None, None], 2, (), []),
    ([], 2, (), []),
])
def test_waves_hold_at_most_max_loras_adapters_in_order_of_first_appearance(keys, max_loras, running, expected):
    assert adapter_waves(keys, max_loras, running) == expected


def test_max_loras_below_one_is_refused():
    with pytest.raises(ValueError, match="max_loras must be >= 1, got 0"):
        adapter_waves(["A"], 0)


#          row:   0     1     2    3     4     5     6     7
ADAPTERS = ["A", "B", None, "A", "C", "A", "B", None]
PROMPTS = ["tx", "sa", "q", "sy", "tz", "tw", "sb", "r"]


@pytest.mark.parametrize("running, order, waves", [
    # wave 0: the base's rows (q r), then A's in prefix order (tw tx share "t": first), then B's; wave 1: C
    ((), [2, 7, 5, 0, 3, 1, 6, 4], [Wave(("A", "B"), 0), Wave(("C",), 7)]),
    # C still holds a slot from the previous shard: it leads the first wave
    (("C",), [2, 7, 4, 5, 0, 3, 1, 6], [Wave(("C", "A"), 0), Wave(("B",), 6)]),
])
def test_rows_run_in_waves_grouped_by_adapter_in_prefix_order_within_each(running, order, waves):
    plan = plan_wave_order([tokens(prompt) for prompt in PROMPTS], ADAPTERS, 2, running)
    assert (plan.order, plan.waves) == (order, waves)


def test_the_lower_bound_sums_each_adapters_own_distinct_prefixes():
    """Prefix-cache blocks are keyed by adapter: "sa", "sb" (B) and "sy" (A) share no "s"."""
    plan = plan_wave_order([tokens(prompt) for prompt in PROMPTS], ADAPTERS, 2)
    assert plan.num_distinct_tokens == 2 + 5 + 3 + 2                    # base q r; A sy tw tx; B sa sb; C tz
    assert plan_prefix_order([tokens(prompt) for prompt in PROMPTS]).num_distinct_tokens == 10


def test_base_rows_alone_are_one_wave_in_prefix_order():
    plan = plan_wave_order([tokens("ab"), tokens("c"), tokens("aa")], [None, None, None], 4)
    assert plan == WavePlan([2, 0, 1], [Wave((), 0)], 4)      # a a b c
    assert plan_wave_order([], [], 4) == WavePlan([], [], 0)


# -- the feed ----------------------------------------------------------------------------

@dataclass
class RecordingLoraEngine:
    """LLMEngine's streaming API with adapters, over 'tokens are the characters' codes';
    refuses the rows of adapters in `bad`, as an adapter that cannot be read is refused."""

    options: GenerateOptions
    max_loras: int
    bad: frozenset = frozenset()
    added: list[tuple[str | None, str]] = field(default_factory=list)   # (adapter, prompt) in the order added
    prefetched: list[tuple[int, list]] = field(default_factory=list)    # (rows added before, adapters asked for)
    queued: dict[int, list[int]] = field(default_factory=dict)

    def prompt_token_ids(self, prompt):
        return tokens(prompt) if prompt else "prompt is empty"

    def add_requests(self, prompts, params, adapter=None):
        adapter = adapter or [None] * len(prompts)      # the feed names none for a chunk of base rows
        assert len(prompts) == len(params) == len(adapter)
        request_ids = []
        for prompt, source in zip(prompts, adapter):
            if source in self.bad:
                request_ids.append(f"adapter {source}: cannot be read")
                continue
            prompt = self.prompt_token_ids(prompt) if isinstance(prompt, str) else prompt
            self.added.append((source, "".join(map(chr, prompt))))
            self.queued[len(self.added) - 1] = prompt
            request_ids.append(len(self.added) - 1)
        return request_ids

    def prefetch_adapters(self, sources):
        self.prefetched.append((len(self.added), list(sources)))

    def step(self):
        finished = [FinishedRequest(request_id, GenerationOutput(token_ids=prompt, text="".join(map(chr, prompt)),
                                                                    finish_reason="length"))
                    for request_id, prompt in self.queued.items()]
        self.queued.clear()
        return finished


LORA_KEY = EngineKey("m", "generate", lora=True)


def lora_shard(inputs: list[str], adapters: list[str | None], params: dict | None = None) -> ShardWork:
    """A shard of a job with an adapter column; each row's params carry its adapter, as jobs.row_params does."""
    spec = SimpleNamespace(mode="generate", params={"max_tokens": 4, "adapter_column": "adapter", **(params or {})},
                           adapter=None, quantization=None, dtype=None, kv_cache_dtype=None)
    return ShardWork(job=SimpleNamespace(model_key="m", spec=spec), claim=None, lease=None, shard=None,
                     ids=pa.array(range(len(inputs)), pa.int64()), inputs=inputs, carried={},
                     todo=list(range(len(inputs))),
                     row_params=[{} if adapter is None else {"adapter": adapter} for adapter in adapters])


def feed_all(feed: GenerateFeed, work: ShardWork, chunk: int) -> None:
    """As the pipeline does: todo positions in order, a chunk at a time, a step after each."""
    while not work.is_fed:
        first_index = work.fed
        feed.add(work, work.take(chunk), first_index)
        feed.step()


#                 row:  0     1     2     3     4     5     6     7     8     9     10
SHARD_ADAPTERS = ["A", "B", None, "C", "A", "B", "D", None, "E", "A", "bad"]
SHARD_INPUTS = ["a1", "b1", "n1", "c1", "a2", "b2", "d1", "", "e1", "a3", "x1"]


@pytest.mark.parametrize("chunk", [1, 3, 11])
def test_a_shard_is_fed_in_waves_and_outputs_land_in_input_order(chunk):
    # Given a shard of five adapters (one that cannot be read), base rows and an empty row, max_loras 2
    llm = RecordingLoraEngine(GenerateOptions(), max_loras=2, bad=frozenset({"bad"}))
    feed = GenerateFeed(SimpleNamespace(llm=llm), LORA_KEY)
    work = lora_shard(SHARD_INPUTS, SHARD_ADAPTERS)
    # When it is fed
    feed_all(feed, work, chunk)
    # Then the base's rows come first, each adapter's rows together, two adapters to a wave...
    runs = [adapter for index, (adapter, _) in enumerate(llm.added) if index == 0 or llm.added[index - 1][0] != adapter]
    assert runs == [None, "A", "B", "C", "D", "E"]
    assert [prompt for _, prompt in llm.added] == ["n1", "a1", "a2", "a3", "b1", "b2", "c1", "d1", "e1"]
    # ...the next wave's adapters asked for when a wave's first rows are queued, before its own rows...
    assert [adapters for _, adapters in llm.prefetched] == [["C", "D"], ["E", "bad"]]
    wave_starts = {"C": 6, "E": 8}      # rows added before each wave's first
    for added_before, adapters in llm.prefetched:
        assert added_before <= wave_starts[adapters[0]]
    if chunk == 1:
        assert [added_before for added_before, _ in llm.prefetched] == [0, 6]
    # ...and every output is its own row's, the errors included.
    assert [output.text for output in work.outputs if output.error is None] == \
        [text for text, adapter in zip(SHARD_INPUTS, SHARD_ADAPTERS) if text and adapter != "bad"]
    assert work.outputs[7].error == "prompt is empty" and "cannot be read" in work.outputs[10].error


def test_a_loras_shard_bound_is_per_adapter_and_leaves_out_refused_rows():
    # Given rows "abcx", "abcy" of A, "abz" of B, a base "ab" and a row of an adapter that cannot be read
    llm = RecordingLoraEngine(GenerateOptions(), max_loras=4, bad=frozenset({"bad"}))
    feed = GenerateFeed(SimpleNamespace(llm=llm), LORA_KEY)
    work = lora_shard(["abcx", "abcy", "abz", "ab", "abcq"], ["A", "A", "B", None, "bad"])
    # When its first row is ordered, the bound counts each adapter's prefixes apart
    feed.add(work, work.take(1), 0)
    assert work.num_prefill_lower_bound == feed.num_prefill_lower_bound == 5 + 3 + 2 + 4
    # and once it is fed, the refused row's tokens have left it
    feed_all(feed, work, 2)
    assert work.num_prefill_lower_bound == feed.num_prefill_lower_bound == 5 + 3 + 2


def test_the_next_shard_starts_with_the_adapters_still_running():
    llm = RecordingLoraEngine(GenerateOptions(), max_loras=2)
    feed = GenerateFeed(SimpleNamespace(llm=llm), LORA_KEY)
    feed_all(feed, lora_shard(["a", "b", "c"], ["A", "B", "C"]), 3)     # waves (A B) (C)
    feed_all(feed, lora_shard(["a", "c", "d"], ["A", "C", "D"]), 3)     # waves (C A) (D)
    assert [adapter for adapter, _ in llm.added] == ["A", "B", "C", "C", "A", "D"]


def test_without_prefix_order_a_loras_rows_are_fed_as_they_come():
    llm = RecordingLoraEngine(GenerateOptions(order_by_prefix=False), max_loras=1)
    feed = GenerateFeed(SimpleNamespace(llm=llm), LORA_KEY)
    feed_all(feed, lora_shard(["a1", "b1", "a2"], ["A", "B", "A"]), 2)
    assert [prompt for _, prompt in llm.added] == ["a1", "b1", "a2"] and not llm.prefetched


# -- the prefetch thread, on tiny random PEFT adapters -------------------------------------

@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A small random Llama's config, and three adapters of it saved by peft."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from engine.generate.model_config import load_decoder_config
    from tests.support.lora_adapters import ATTENTION, MLP, save_random_adapter
    from tests.support.random_decoders import save_random_decoder

    root = tmp_path_factory.mktemp("lora-prefetch")
    base = save_random_decoder(root / "base", "llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    folders = [save_random_adapter(model, root / name, 4, ATTENTION + MLP, seed, 0.3)
               for seed, name in enumerate("abcd")]
    return SimpleNamespace(base=base, config=load_decoder_config(base), folders=folders)


def manager(adapters, max_loras=2, max_cpu_loras=8):
    from engine.lora.manager import LoraManager
    from engine.lora.options import LoraOptions

    return LoraManager(LoraOptions(max_loras=max_loras, max_lora_rank=8, max_cpu_loras=max_cpu_loras),
                       adapters.config, torch.float32, torch.device("cpu"), use_kernels=False)


def test_prefetch_reads_the_next_waves_adapters_into_the_host_cache(adapters, tmp_path):
    # Given copies of two adapters, prefetched
    a, b = (shutil.copytree(folder, tmp_path / folder.name) for folder in adapters.folders[:2])
    lora = manager(adapters)
    futures.wait(lora.prefetch([a, b]))
    assert lora.host_sources == [str(a), str(b)] and lora.num_prefetched == 2
    # When their rows are queued after the folders are gone, they are served from the host cache
    shutil.rmtree(a)
    shutil.rmtree(b)
    assert lora.adapter(a).source == str(a) and lora.adapter(b).rank == 4


def test_a_failed_prefetch_is_the_rows_error_when_they_are_queued(adapters, tmp_path):
    from engine.lora.adapter_config import AdapterError

    lora = manager(adapters)
    futures.wait(lora.prefetch([tmp_path / "missing"]))
    assert lora.host_sources == [] and lora.num_prefetched == 0
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        lora.adapter(tmp_path / "missing")


def test_prefetch_leaves_room_for_the_running_wave(adapters):
    lora = manager(adapters, max_loras=2, max_cpu_loras=3)
    assert len(lora.prefetch(adapters.folders[:3])) == 1


def test_an_adapter_asked_for_while_prefetched_is_read_once(adapters, monkeypatch):
    import engine.lora.manager as manager_module

    reads = []
    real_load = manager_module.load_adapter
    monkeypatch.setattr(manager_module, "load_adapter", lambda source, *rest: reads.append(source) or
                        real_load(source, *rest))
    lora = manager(adapters)
    *_, last = adapters.folders
    started = lora.prefetch(adapters.folders)
    adapter = lora.adapter(last)            # its prefetch is cancelled if not started, else waited for
    futures.wait(started)
    assert lora.adapter(last) is adapter and reads.count(str(last)) == 1


# -- a real engine through the feed --------------------------------------------------------

def test_a_real_engine_fed_in_waves_gives_each_row_its_adapters_tokens(adapters):
    from engine.generate.llm_engine import LLMEngine
    from engine.generate.sampling_params import SamplingParams
    from engine.lora.options import LoraOptions

    # Given an engine of two slots and a shard of four adapters and the base, round robin
    llm = LLMEngine.load(adapters.base, torch.float32, torch.device("cpu"),
                         GenerateOptions(num_blocks=64, max_num_seqs=2), lora=LoraOptions(max_loras=2, max_lora_rank=8))
    sources = [str(folder) for folder in adapters.folders] + [None]
    rows = [(prompt, sources[row % len(sources)])
            for row, prompt in enumerate([[1, 5, 9, 33], [1, 42, 43], [1, 300, 301, 8], [1, 7]] * 3)]
    asked = []
    prefetch = llm.prefetch_adapters
    llm.prefetch_adapters = lambda sources: asked.append(list(sources)) or prefetch(sources)
    work = lora_shard([prompt for prompt, _ in rows], [source for _, source in rows],
                      {"max_tokens": 5, "temperature": 0.0, "ignore_eos": True})
    feed = GenerateFeed(SimpleNamespace(llm=llm), LORA_KEY)
    # When the pipeline feeds it as many rows as the feed wants, stepping between
    while not work.is_fed or feed.num_requests:
        if not work.is_fed and feed.wants_rows:
            first_index = work.fed
            feed.add(work, work.take(feed.wants_rows), first_index)
        feed.step()
    # Then the second wave's adapters were asked for, each adapter took a slot once,
    assert asked == [sources[2:4]]
    assert llm.lora.num_slot_loads == 4
    # and each row's tokens are its adapter's, as when it runs alone
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for (prompt, source), output in zip(rows, work.outputs):
        assert output.token_ids == llm.generate([prompt], greedy, adapter=source)[0].token_ids, source
