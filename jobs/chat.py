"""Chat prompts for generate jobs: what a row becomes before the engine renders it with
the model's chat template.

A row may hold chat messages already (a list of {role, content}, as OpenAI's
`messages`), or a plain string. With `params={"chat": True}` a string becomes one user
message, after the job's `system_prompt` when it has one; without it a string goes to the
engine as raw text, as before. The engine applies the template and its generation
prompt (engine.generate.tokenizer), so an instruct model answers instead of continuing.
"""

from __future__ import annotations

CHAT_PARAMS = ("chat", "system_prompt")   # generate params that shape the prompt, not the sampling


def chat_prompts(inputs: list, params: dict) -> list:
    """`inputs` with every string turned into chat messages when the job asks for chat;
    messages, nulls and everything else pass through (the engine names a bad row)."""
    if not params.get("chat"):
        return inputs
    system = params.get("system_prompt")
    prefix = [{"role": "system", "content": system}] if system else []
    return [prefix + [{"role": "user", "content": value}] if isinstance(value, str) else value
            for value in inputs]


def without_chat_params(params: dict) -> dict:
    """A generate job's params less the chat ones: what engine.SamplingParams takes."""
    return {name: value for name, value in params.items() if name not in CHAT_PARAMS}
