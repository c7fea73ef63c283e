"""The yes/no reranker's prompt, as Qwen3-Reranker's model card builds it. Torch-free.

    <|im_start|>system\\nJudge whether ... "yes" or "no".<|im_end|>\\n<|im_start|>user\\n   PREFIX
    <Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {document}                   the pair
    <|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n                         SUFFIX

The model's next token after the prompt is "yes" or "no"; the score is P(yes) under a
softmax over those two logits. The document comes last of the variable parts, so every
pair of one query starts with the same tokens up to "<Document>:": what the generate
engine's prefix cache shares between them (engine/score/query_groups.py).

As the model card does, the prefix and suffix are tokenized alone and the pair text is cut
(from its end, the document's) so that the whole prompt fits.
"""

from __future__ import annotations

from collections.abc import Callable

PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def pair_text(instruction: str | None, query: str, document: str) -> str:
    instruction = DEFAULT_INSTRUCTION if instruction is None else instruction
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


class RerankPrompt:
    """Token ids of PREFIX + the pair + SUFFIX, at most `max_tokens` long; `encode` adds no
    special tokens (the prefix writes its own)."""

    def __init__(self, encode: Callable[[str], list[int]], max_tokens: int):
        self.encode = encode
        self.prefix_ids, self.suffix_ids = encode(PREFIX), encode(SUFFIX)
        self.max_tokens = max_tokens

    def token_ids(self, instruction: str | None, query: str, document: str, truncate: bool) -> list[int] | str:
        """The prompt's token ids, or why the pair cannot be scored."""
        pair = self.encode(pair_text(instruction, query, document))
        room = self.max_tokens - len(self.prefix_ids) - len(self.suffix_ids)
        if len(pair) > room:
            if not truncate or room < 1:
                num_tokens = len(self.prefix_ids) + len(pair) + len(self.suffix_ids)
                return (f"pair has {num_tokens} prompt tokens, over the {self.max_tokens} the model takes"
                        + ("" if truncate else " (refused because truncate=False)"))
            pair = pair[:room]
        return self.prefix_ids + pair + self.suffix_ids
