"""Grammars against one model's vocabulary: compiled once per constraint, matched per request.

    GrammarCache        StructuredOutput -> compiled grammar (xgrammar), LRU-bounded; compiling
                        happens on a worker thread, so a request whose grammar is not ready yet
                        waits unscheduled while the rest of the batch steps on
    RequestGrammar      one request's matcher: the next token's bitmask, each accepted token,
                        and the tokens the grammar forces next (jump-forward)
    apply_grammar_masks the constrained rows of a step's logits set to -inf outside the grammar

NOTE: the matcher's state is the request's output so far, and nothing else. A preempted
request keeps its output tokens and so its matcher: recomputing its K/V changes neither.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.generate.structured import StructuredOutput, grammar_of, native_message
from engine.generate.tokenizer import TextTokenizer

MAX_COMPILED_GRAMMARS = 64      # a job mixing tasks has a handful; a grammar is tens of kB to MBs


class RequestGrammar:
    def __init__(self, compiled: Future):
        self._compiled = compiled
        self._matcher = None
        self.is_rejected = False        # a token outside the grammar was accepted: an engine bug

    @property
    def is_ready(self) -> bool:
        """Compiled (or failed to): the request may be scheduled."""
        return self._compiled.done()

    @property
    def error(self) -> str | None:
        """Why the grammar could not be compiled against this vocabulary, once it is ready."""
        error = self._compiled.exception() if self._compiled.done() else None
        return None if error is None else f"structured output does not compile: {native_message(error)}"

    def wait(self) -> None:
        self._compiled.exception()      # blocks until done; raises nothing

    @property
    def matcher(self):
        if self._matcher is None:
            import xgrammar
            self._matcher = xgrammar.GrammarMatcher(self._compiled.result())
        return self._matcher

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return self.matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            self.is_rejected = True

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar allows as the only continuation (never a stop token)."""
        return self.matcher.find_jump_forward_tokens()


class GrammarCache:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, stop_token_ids: frozenset[int],
                 max_entries: int = MAX_COMPILED_GRAMMARS):
        import xgrammar
        self._compiler = xgrammar.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, stop_token_ids),
                                                  cache_enabled=False)     # this class is the cache
        self._compiled: OrderedDict[StructuredOutput, Future] = OrderedDict()     # least recently used first
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="barge-grammar")
        self.max_entries = max_entries

    def grammar_for(self, structured: StructuredOutput) -> RequestGrammar:
        """A fresh matcher over the (possibly still compiling) grammar of this constraint."""
        compiled = self._compiled.pop(structured, None) or self._pool.submit(self._compile, structured)
        self._compiled[structured] = compiled
        while len(self._compiled) > self.max_entries:
            self._compiled.popitem(last=False)
        return RequestGrammar(compiled)

    def _compile(self, structured: StructuredOutput):
        return self._compiler.compile_grammar(grammar_of(structured))


def tokenizer_info(tokenizer: TextTokenizer, vocab_size: int, stop_token_ids: frozenset[int]):
    """What xgrammar needs of the vocabulary: each token's text as the tokenizer stores it
    (decoded by xgrammar according to the vocabulary's type) and the stop tokens."""
    import xgrammar
    raw = tokenizer.backend
    encoded_vocab = [""] * vocab_size
    for token, token_id in raw.get_vocab(with_added_tokens=True).items():
        if token_id < vocab_size:
            encoded_vocab[token_id] = token
    # The detection xgrammar's own TokenizerInfo.from_huggingface runs on the same JSON;
    # its public entry point wants a transformers tokenizer, which Barge does not load.
    metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(raw.to_str())
    return xgrammar.TokenizerInfo(encoded_vocab, metadata["vocab_type"], vocab_size=vocab_size,
                                  stop_token_ids=sorted(stop_token_ids), add_prefix_space=metadata["add_prefix_space"])


def apply_grammar_masks(logits: torch.Tensor, grammars: list[RequestGrammar | None]) -> None:
    """In place: each constrained row's logits outside its grammar become -inf. Unconstrained
    rows are left untouched (not even copied), so they sample as they would alone."""
    rows = [row for row, grammar in enumerate(grammars) if grammar is not None]
    if not rows:
        return
    import xgrammar
    bitmask = xgrammar.allocate_token_bitmask(len(grammars), logits.shape[-1])
    for row in rows:
        grammars[row].fill_bitmask(bitmask, row)
    # On a GPU this is xgrammar's CUDA kernel; on CPU its C++ loop.
    xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)
