"""JobSpec params for mode "embed": truncate or refuse, float32 or float16 output."""

from __future__ import annotations

import pytest

from jobs.spec import JobSpec, JobSpecError

VALID = dict(mode="embed", model="minilm", input="/data/in/*.parquet", output="/data/out/")


@pytest.mark.parametrize("params", [
    {"truncate": False},
    {"truncate": True, "output_dtype": "float16"},
    {"output_dtype": "float32", "dimensions": 128, "normalize": True},
])
def test_accepted(params):
    assert JobSpec(**VALID, params=params).params == params


@pytest.mark.parametrize("params, field, words", [
    ({"truncate": "no"}, "params.truncate", "a boolean"),
    ({"truncate": 0}, "params.truncate", "a boolean"),
    ({"output_dtype": "bfloat16"}, "params.output_dtype", '"float32" or "float16"'),
    ({"output_dtype": 16}, "params.output_dtype", '"float32" or "float16"'),
])
def test_refused_naming_the_param(params, field, words):
    with pytest.raises(JobSpecError) as caught:
        JobSpec(**VALID, params=params)
    assert caught.value.field == field and words in caught.value.problem
