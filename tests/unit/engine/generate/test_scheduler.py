"""Scheduler on CPU with fabricated model outputs: no model runs, sampled tokens are made up."""

import pytest

from engine.generate.block_manager import BlockManager
from engine.generate.request import Request, RequestStatus
from engine.generate.sampling_params import SamplingParams
from engine.generate.scheduler import Scheduler, SchedulerConfig, SchedulerOutput

TOKEN = 7      # every fabricated sample


def _scheduler(num_blocks=64, block_size=4, **config) -> Scheduler:
    config = {"max_num_seqs": 8, "max_num_batched_tokens": 32, "max_model_len": 256, "admission_reserve": 0.0, **config}
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size))


def _request(request_id: int, num_prompt_tokens: int, max_tokens: int = 4, first_token: int = 100) -> Request:
    prompt = list(range(first_token, first_token + num_prompt_tokens))
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _step(scheduler: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    """One step with the model replaced by 'every request that reaches its end samples TOKEN'."""
    output = scheduler.schedule()
    sampled = {r.request_id: TOKEN for r in output.requests
               if r.num_computed_tokens + output.num_scheduled_tokens[r.request_id] == r.num_tokens}
    return output, scheduler.update_from_output(output, sampled)


def _run(scheduler: Scheduler, max_steps: int = 500) -> list[SchedulerOutput]:
    outputs = []
    while scheduler.has_unfinished_requests():
        outputs.append(_step(scheduler)[0])
        assert len(outputs) < max_steps
    return outputs


def test_admits_up_to_max_num_seqs_and_the_token_budget():
    scheduler = _scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for request_id in range(3):      # distinct prompts: equal ones would wait for the first's blocks
        scheduler.add_request(_request(request_id, 10, first_token=100 * (request_id + 1)))
    output, _ = _step(scheduler)
    assert [r.request_id for r in output.requests] == [0, 1]
    assert output.total_num_scheduled_tokens == 20
    assert len(scheduler.waiting) == 1


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes():
    scheduler = _scheduler(max_num_batched_tokens=16)
    scheduler.add_request(_request(0, 4))
    _step(scheduler)                                    # request 0 prefilled, first token sampled
    scheduler.add_request(_request(1, 40, first_token=500))
    output, _ = _step(scheduler)
    assert output.num_scheduled_tokens == {0: 1, 1: 15}       # one decode + a 15-token chunk
    output, _ = _step(scheduler)
    assert output.num_scheduled_tokens == {0: 1, 1: 15}
    long_request = scheduler.running[1]
    assert long_request.num_computed_tokens == 30 and long_request.num_output_tokens == 0
    output, _ = _step(scheduler)
    assert output.num_scheduled_tokens == {0: 1, 1: 10}
    assert long_request.num_output_tokens == 1            # the last chunk samples


def test_requests_finish_at_max_tokens_and_free_their_blocks():
    scheduler = _scheduler()
    scheduler.add_request(_request(0, 5, max_tokens=3))
    finished = []
    while scheduler.has_unfinished_requests():
        finished += _step(scheduler)[1]
    assert finished[0].output_token_ids == [TOKEN] * 3
    assert finished[0].status == RequestStatus.FINISHED_LENGTH
    assert scheduler.block_manager.num_free_blocks == 64


def test_eos_and_stop_token_ids_finish_with_stop():
    scheduler = _scheduler()
    eos = Request(0, [1, 2, 3], SamplingParams(max_tokens=10), eos_token_ids=frozenset({TOKEN}))
    stop = Request(1, [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(TOKEN,)))
    ignored = Request(2, [1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True), eos_token_ids=frozenset({TOKEN}))
    for request in (eos, stop, ignored):
        scheduler.add_request(request)
    _run(scheduler)
    assert eos.status == stop.status == RequestStatus.FINISHED_STOPPED and eos.num_output_tokens == 1
    assert ignored.status == RequestStatus.FINISHED_LENGTH and ignored.num_output_tokens == 2


def test_the_context_limit_ends_generation_with_length():
    scheduler = _scheduler(max_model_len=8)
    request = _request(0, 6, max_tokens=100)
    scheduler.add_request(request)
    _run(scheduler)
    assert request.num_tokens == 8 and request.status == RequestStatus.FINISHED_LENGTH


def test_when_blocks_run_out_the_newest_request_is_preempted_and_later_resumed():
    scheduler = _scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    first, second = _request(0, 8, max_tokens=8), _request(1, 8, max_tokens=8, first_token=300)
    scheduler.add_request(first)
    scheduler.add_request(second)
    outputs = _run(scheduler)
    preempted = [r.request_id for output in outputs for r in output.preempted]
    assert preempted and set(preempted) == {1}            # the oldest keeps running
    assert first.output_token_ids == second.output_token_ids == [TOKEN] * 8
    assert scheduler.num_preemptions == len(preempted)
    assert scheduler.block_manager.num_free_blocks == 6


def test_a_preempted_request_recomputes_prompt_and_outputs():
    scheduler = _scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    first, second = _request(0, 8, max_tokens=6), _request(1, 6, max_tokens=6, first_token=300)
    scheduler.add_request(first)
    scheduler.add_request(second)
    outputs = _run(scheduler)
    resumed_at = next(i for i, output in enumerate(outputs) if output.preempted)
    resume = next(o for o in outputs[resumed_at + 1:] if 1 in o.num_scheduled_tokens)
    # it comes back with its prompt and the tokens it had generated, less any cached blocks
    assert resume.num_scheduled_tokens[1] > 1
    assert second.num_output_tokens == 6


def test_a_shared_prefix_is_computed_once():
    scheduler = _scheduler(max_num_batched_tokens=64)
    shared = list(range(100, 112))                        # three full blocks
    first = Request(0, shared + [1], SamplingParams(max_tokens=5, ignore_eos=True))
    scheduler.add_request(first)
    _step(scheduler)
    second = Request(1, shared + [2, 3], SamplingParams(max_tokens=2, ignore_eos=True))
    scheduler.add_request(second)
    output, _ = _step(scheduler)
    assert second.num_cached_tokens == 12
    assert output.num_scheduled_tokens[1] == 2
    assert second.block_ids[:3] == first.block_ids[:3]


def test_finish_from_outside_frees_a_waiting_or_running_request():
    scheduler = _scheduler(max_num_seqs=1)
    running, waiting = _request(0, 4, max_tokens=50), _request(1, 4)
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    _step(scheduler)
    scheduler.finish(running, RequestStatus.FINISHED_ABORTED)
    scheduler.finish(waiting, RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.block_manager.num_free_blocks == 64
    assert running.status.finish_reason == "abort"


@pytest.mark.parametrize("name, value", [("max_num_seqs", 0), ("max_num_batched_tokens", -1), ("max_model_len", 1.5)])
def test_bad_config_names_the_field(name, value):
    with pytest.raises(ValueError, match=name):
        SchedulerConfig(**{name: value})
