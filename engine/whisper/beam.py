"""BeamSearch: the hypotheses of one chunk decoded with beam_size > 1, ranked as openai-whisper does.

A chunk with beam_size N holds N decoder slots, one per hypothesis. Every hypothesis
is a DecodeRequest row of its own (its tokens fed, its sampled tokens, its summed
log-probability); the chunk's own request is `rows[0]`, the leader, which also holds
what belongs to the chunk rather than a hypothesis (language, no-speech probability,
encoder output, and in the end the chosen tokens). All rows share the leader's encoder
output, and the forced start-of-transcript tokens are fed to all of them alike.

NOTE: this mirrors openai-whisper's BeamSearchDecoder (patience 1.0) and
MaximumLikelihoodRanker (length_penalty None) step for step, because token parity
with it depends on the same candidates, the same float32 sums and the same tie order:
each row proposes its beam_size + 1 likeliest tokens; candidates are ranked by summed
log-probability; those ending in <|endoftext|> join the finished list (at most
beam_size of them, best first), the best beam_size others become the next rows. The
chunk ends once beam_size candidates have finished, or at the length limit, when the
likeliest live rows fill the list up. The winner has the highest sum / length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.whisper.request import DecodeRequest


@dataclass(frozen=True)
class Candidate:
    """A next hypothesis: row `source`'s tokens plus `token`, with summed log-probability `sum_logprob`."""

    source: int
    token: int
    sum_logprob: float


@dataclass(eq=False)
class BeamSearch:
    eot: int
    rows: list[DecodeRequest]          # the live hypotheses; rows[0] is the chunk's own request
    finished: dict[tuple[int, ...], float] = field(default_factory=dict)   # sampled tokens + eot -> sum logprob

    @classmethod
    def around(cls, request: DecodeRequest, eot: int) -> "BeamSearch":
        """Give `request` beam_size - 1 sibling rows and make it their leader."""
        siblings = [DecodeRequest(request.request_id, None, request.options, request.language)
                    for _ in range(request.options.beam_size - 1)]
        beam = cls(eot, [request, *siblings])
        for row in beam.rows:
            row.beam = beam
        return beam

    @property
    def beam_size(self) -> int:
        return len(self.rows)

    @property
    def leader(self) -> DecodeRequest:
        return self.rows[0]

    @property
    def is_done(self) -> bool:
        return len(self.finished) >= self.beam_size

    def follow_leader(self) -> None:
        """While tokens are forced every row is the leader's copy: same fed tokens, same
        language, same tokens still to force."""
        leader = self.leader
        for row in self.rows[1:]:
            row.fed, row.pending, row.language = list(leader.fed), leader.pending.copy(), leader.language

    def candidates(self, logprobs: torch.Tensor) -> list[Candidate]:
        """logprobs [beam_size, vocab] (float32, after the logit rules) continuing rows →
        the next beam_size live hypotheses, best first; finished ones are kept aside."""
        top_logprobs, top_tokens = logprobs.float().topk(self.beam_size + 1)
        # float32 sums, as openai-whisper's sum_logprobs tensor holds them
        sums = torch.tensor([row.sum_logprob for row in self.rows], dtype=torch.float32)
        new_sums = (sums[:, None] + top_logprobs.cpu()).tolist()
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], int] = {}
        for index, row in enumerate(self.rows):
            for token, score in zip(top_tokens[index].tolist(), new_sums[index]):
                sequence = (*row.output, token)
                scores[sequence], sources[sequence] = score, index
        live, newly_finished = [], {}
        for sequence in sorted(scores, key=scores.get, reverse=True):
            if sequence[-1] == self.eot:
                newly_finished[sequence] = scores[sequence]
                continue
            live.append(Candidate(sources[sequence], sequence[-1], scores[sequence]))
            if len(live) == self.beam_size:
                break
        for sequence in sorted(newly_finished, key=newly_finished.get, reverse=True):
            if len(self.finished) >= self.beam_size:
                break
            self.finished[sequence] = newly_finished[sequence]
        return live

    def advance(self, live: list[Candidate]) -> None:
        """Row k becomes live[k]: its source's tokens plus the new token (the caller copies
        the source's self-attention K/V rows to match)."""
        previous = [(row.fed, row.output) for row in self.rows]
        for row, candidate in zip(self.rows, live):
            fed, output = previous[candidate.source]
            row.fed, row.output, row.sum_logprob = list(fed), [*output, candidate.token], candidate.sum_logprob

    def finish(self) -> None:
        """Fill the finished list from the live rows when short, then give the leader the
        candidate with the highest sum_logprob / length (sampled tokens, eot excluded)."""
        finished = dict(self.finished)
        if len(finished) < self.beam_size:
            sums = np.array([row.sum_logprob for row in self.rows], dtype=np.float32)
            for index in list(np.argsort(sums))[::-1]:
                finished[(*self.rows[index].output, self.eot)] = float(sums[index])
                if len(finished) >= self.beam_size:
                    break
        sequences = [list(sequence[:sequence.index(self.eot)]) for sequence in finished]
        sum_logprobs = list(finished.values())
        # max(..., 1): an empty candidate cannot arise (a chunk's first token is never eot), but must not divide by 0
        best = int(np.argmax([s / max(len(tokens), 1) for s, tokens in zip(sum_logprobs, sequences)]))
        self.leader.output, self.leader.sum_logprob = sequences[best], sum_logprobs[best]
