"""Structured requests in the scheduler, with fabricated outputs: a request whose grammar is
still compiling waits unscheduled while the others run, and a grammar that completes ends
its request as "stop" even with ignore_eos."""

from concurrent.futures import Future

from engine.generate.block_manager import BlockManager
from engine.generate.grammar import RequestGrammar
from engine.generate.request import Request, RequestStatus
from engine.generate.sampling_params import SamplingParams
from engine.generate.scheduler import Scheduler, SchedulerConfig


class CompletesAfter(RequestGrammar):
    """A grammar stand-in that terminates once it has accepted `length` tokens."""

    def __init__(self, compiled: Future, length: int):
        super().__init__(compiled)
        self.length, self.accepted = length, []

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    @property
    def is_terminated(self) -> bool:
        return len(self.accepted) >= self.length


def _scheduler() -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
                                     admission_reserve=0.0), BlockManager(64, 4))


def _request(request_id: int, grammar: RequestGrammar | None = None) -> Request:
    request = Request(request_id, [100 + request_id] * 5, SamplingParams(max_tokens=50, ignore_eos=True))
    request.grammar = grammar
    return request


def _step(scheduler: Scheduler):
    output = scheduler.schedule()
    return output, scheduler.update_from_output(output, {r.request_id: 7 for r in output.requests})


def test_a_request_whose_grammar_is_compiling_waits_while_the_others_run():
    compiling = Future()
    scheduler = _scheduler()
    scheduler.add_request(_request(0, CompletesAfter(compiling, 3)))
    scheduler.add_request(_request(1))
    output, _ = _step(scheduler)
    assert [r.request_id for r in output.requests] == [1]
    assert [r.request_id for r in scheduler.waiting] == [0]
    compiling.set_result("compiled")
    output, _ = _step(scheduler)
    assert sorted(r.request_id for r in output.requests) == [0, 1]


def test_a_completed_grammar_ends_the_request_as_stop_even_with_ignore_eos():
    done = Future()
    done.set_result("compiled")
    grammar = CompletesAfter(done, 3)
    scheduler = _scheduler()
    scheduler.add_request(_request(0, grammar))
    finished = []
    for _ in range(5):
        finished += _step(scheduler)[1]
    assert finished and finished[0].status == RequestStatus.FINISHED_STOPPED
    assert finished[0].num_output_tokens == 3 and grammar.accepted == [7, 7, 7]
