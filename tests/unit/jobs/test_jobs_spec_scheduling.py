"""JobSpec fields for scheduling and output shape: priority, carried columns, work bounds."""

import pytest

from jobs.spec import JobSpec, JobSpecError

BASE = dict(mode="embed", model="minilm", input="in/", output="out/")


@pytest.mark.parametrize("changes, field", [
    (dict(priority=10), "priority"),
    (dict(priority=-1), "priority"),
    (dict(priority=True), "priority"),
    (dict(priority="high"), "priority"),
    (dict(max_tokens_per_shard=0), "max_tokens_per_shard"),
    (dict(max_tokens_per_shard=2.5), "max_tokens_per_shard"),
    (dict(carry_columns=["lang", ""]), "carry_columns"),
])
def test_bad_scheduling_fields_are_refused(changes, field):
    with pytest.raises(JobSpecError) as caught:
        JobSpec(**BASE, **changes)
    assert caught.value.field == field


def test_defaults_and_normalisation():
    spec = JobSpec(**BASE, carry_columns="lang")
    assert spec.carry_columns == ("lang",)
    assert (spec.priority, spec.max_tokens_per_shard, spec.errors_file, spec.partition_columns) == (5, 1_000_000, True, False)
    assert JobSpec(**BASE, carry_columns=["a", "b"], max_tokens_per_shard=None).carry_columns == ("a", "b")
    assert JobSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("params, field", [
    ({"max_tokens": "many"}, "params.max_tokens"),
    ({"temperature": "hot"}, "params.temperature"),
    ({"stop": "END"}, "params.stop"),
    ({"dimensions": 8}, "params.dimensions"),   # an embed parameter
])
def test_generate_params_are_type_checked(params, field):
    with pytest.raises(JobSpecError) as caught:
        JobSpec(**{**BASE, "mode": "generate"}, params=params)
    assert caught.value.field == field


def test_generate_accepts_sampling_params():
    spec = JobSpec(**{**BASE, "mode": "generate"}, params={"max_tokens": 64, "temperature": 0.7, "top_p": 0.9,
                                                           "seed": 1, "stop": ["\n\n"], "ignore_eos": False})
    assert spec.params["stop"] == ["\n\n"]
