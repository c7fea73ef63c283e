"""jobs.row_params: each row's params from its JSON column, or that row's error."""

import json

import pytest

from jobs.row_params import check_row_column_params, embed_row_error, row_columns, row_overrides, shared_params


def test_a_structured_column_row_becomes_that_rows_constraint_and_null_the_jobs():
    values = [json.dumps({"regex": "[0-9]+"}), None, json.dumps({"choice": ["a", "b"]}), "null"]
    overrides, errors = row_overrides({"structured_column": "c"}, {"c": values})
    assert overrides == [{"structured": {"regex": "[0-9]+"}}, {}, {"structured": {"choice": ["a", "b"]}}, {}]
    assert errors == {}


def test_a_params_column_row_overrides_the_job_and_joins_the_structured_column():
    columns = {"p": [json.dumps({"max_tokens": 3, "seed": 1}), None],
               "s": [json.dumps({"json_object": True}), json.dumps({"regex": "x"})]}
    overrides, errors = row_overrides({"params_column": "p", "structured_column": "s"}, columns)
    assert overrides == [{"max_tokens": 3, "seed": 1, "structured": {"json_object": True}},
                         {"structured": {"regex": "x"}}]
    assert errors == {}


@pytest.mark.parametrize("name, value, message", [
    ("structured_column", "{oops", "column 'c' (params.structured_column) is not valid JSON"),
    ("params_column", "[1]", "must hold a JSON object of params, got list"),
    ("params_column", json.dumps({"chat": True}), "sets chat, which only a job's params can set"),
])
def test_a_bad_row_value_is_that_rows_error(name, value, message):
    overrides, errors = row_overrides({name: "c"}, {"c": [None, value]})
    assert overrides[0] == {} and message in errors[1] and 0 not in errors


@pytest.mark.parametrize("params, field", [
    ({"structured_column": 3}, "params.structured_column"),
    ({"params_column": ""}, "params.params_column"),
    ({"structured_column": "c", "structured": {"regex": "x"}}, "params.structured"),
])
def test_malformed_row_column_params_are_named(params, field):
    assert check_row_column_params(params).startswith(field)


def test_row_columns_are_named_by_their_field():
    assert row_columns({"structured_column": "c", "params_column": None, "max_tokens": 3}) == {
        "params.structured_column": "c"}


@pytest.mark.parametrize("override, message", [
    ({}, None),
    ({"dimensions": 32}, None),
    ({"dimensions": None}, None),    # the model's whole width, whatever the job's
    ({"dimensions": 0}, "dimensions must be a positive integer or null, got 0"),
    ({"dimensions": 2.5}, "dimensions must be a positive integer or null, got 2.5"),
    ({"dimensions": True}, "dimensions must be a positive integer or null, got True"),
    ({"normalize": False, "dimensions": 8}, "sets normalize; an embed row sets only dimensions"),
])
def test_an_embed_row_sets_only_a_positive_dimensions(override, message):
    assert embed_row_error(override) == message


def test_shared_params_leave_out_the_columns():
    assert shared_params({"params_column": "p", "structured_column": "s", "dimensions": 64}) == {"dimensions": 64}
