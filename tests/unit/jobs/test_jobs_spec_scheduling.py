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
