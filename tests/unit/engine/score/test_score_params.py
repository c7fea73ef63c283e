"""ClassifyParams and ScoreParams refuse a bad value with ValueError naming it."""

import pytest

from engine.score.params import ClassifyParams, ScoreParams


@pytest.mark.parametrize("fields, name", [
    (dict(truncate="yes"), "truncate"),
    (dict(activation="relu"), "activation"),
    (dict(threshold=1.5), "threshold"),
    (dict(threshold=True), "threshold"),
    (dict(return_all_scores=1), "return_all_scores"),
])
def test_bad_classify_params(fields, name):
    with pytest.raises(ValueError, match=name):
        ClassifyParams(**fields)


@pytest.mark.parametrize("fields, name", [
    (dict(truncate=None), "truncate"),
    (dict(activation="softmax"), "activation"),      # one score per pair: no softmax
    (dict(instruction=3), "instruction"),
    (dict(yes_token=""), "yes_token"),
    (dict(no_token=None), "no_token"),
    (dict(yes_token="no"), "must differ"),
    (dict(group_by_query="false"), "group_by_query"),
])
def test_bad_score_params(fields, name):
    with pytest.raises(ValueError, match=name):
        ScoreParams(**fields)


def test_defaults_are_valid_and_frozen():
    params = ScoreParams()
    assert (params.yes_token, params.no_token, params.group_by_query) == ("yes", "no", True)
    with pytest.raises(AttributeError):
        params.truncate = False
    assert ClassifyParams().activation == "auto"
