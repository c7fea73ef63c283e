"""`barge submit` options become the JobSpec fields of the same name, validated as any other."""

from __future__ import annotations

import pytest

from cli.job import submitted_spec
from cli.main import _parser
from jobs.spec import JobSpecError

REQUIRED = ["submit", "--model", "minilm", "--input", "in/", "--output", "out/"]


def test_quantization_and_its_check_map_to_the_spec():
    spec = submitted_spec(_parser().parse_args(REQUIRED + ["--quantization", "fp8", "--quant-check-rows", "64"]))
    assert (spec.quantization, spec.quant_check_rows) == ("fp8", 64)
    assert submitted_spec(_parser().parse_args(REQUIRED)).quantization is None


def test_a_check_without_quantization_is_refused_naming_the_field():
    with pytest.raises(JobSpecError) as refused:
        submitted_spec(_parser().parse_args(REQUIRED + ["--quant-check-rows", "64"]))
    assert refused.value.field == "quant_check_rows"


def test_an_unknown_quantization_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(REQUIRED + ["--quantization", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_the_kv_cache_dtype_maps_to_the_spec_and_is_refused_off_generate():
    spec = submitted_spec(_parser().parse_args(REQUIRED + ["--mode", "generate", "--kv-cache-dtype", "fp8"]))
    assert (spec.mode, spec.kv_cache_dtype) == ("generate", "fp8")
    with pytest.raises(JobSpecError) as refused:
        submitted_spec(_parser().parse_args(REQUIRED + ["--kv-cache-dtype", "fp8"]))
    assert refused.value.field == "kv_cache_dtype"


def test_a_score_jobs_params_parse_as_json_or_else_as_the_text_given():
    spec = submitted_spec(_parser().parse_args(REQUIRED + [
        "--mode", "score", "--param", "query_column=q", "--param", 'document_column="d"',
        "--param", "group_column=query_id", "--param", "top_n=10", "--param", "instruction=Find: the answer"]))
    assert (spec.mode, spec.params) == ("score", {"query_column": "q", "document_column": "d",
                                                  "group_column": "query_id", "top_n": 10,
                                                  "instruction": "Find: the answer"})
    classify = submitted_spec(_parser().parse_args(REQUIRED + ["--mode", "classify", "--param", "all_scores=true"]))
    assert classify.params == {"all_scores": True}
