"""JobSpec params for mode "embed": truncate or refuse, float32 or float16 output, a prompt."""

from __future__ import annotations

import pytest

from jobs.spec import JobSpec, JobSpecError

VALID = dict(mode="embed", model="minilm", input="/data/in/*.parquet", output="/data/out/")


@pytest.mark.parametrize("params", [
    {"truncate": False},
    {"truncate": True, "output_dtype": "float16"},
    {"output_dtype": "float32", "dimensions": 128, "normalize": True},
    {"prompt": "Instruct: Given a web search query, retrieve relevant passages\nQuery:"},
    {"prompt_name": "query", "prompt": None},
])
def test_accepted(params):
    assert JobSpec(**VALID, params=params).params == params


@pytest.mark.parametrize("params, field, words", [
    ({"truncate": "no"}, "params.truncate", "a boolean"),
    ({"truncate": 0}, "params.truncate", "a boolean"),
    ({"output_dtype": "bfloat16"}, "params.output_dtype", '"float32" or "float16"'),
    ({"output_dtype": 16}, "params.output_dtype", '"float32" or "float16"'),
    ({"prompt": ["Instruct: x"]}, "params.prompt", "a string put before every text"),
    ({"prompt_name": 1}, "params.prompt_name", "the name of one of the model's prompts"),
    ({"prompt": "q: ", "prompt_name": "query"}, "params.prompt_name", "not both"),
])
def test_refused_naming_the_param(params, field, words):
    with pytest.raises(JobSpecError) as caught:
        JobSpec(**VALID, params=params)
    assert caught.value.field == field and words in caught.value.problem
