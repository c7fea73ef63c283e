"""Output columns per mode."""

from __future__ import annotations

import pyarrow as pa
import pytest

from storage import output_schema

ID = pa.field("doc_id", pa.int64())


def test_embed():
    schema = output_schema("embed", ID, dimensions=384)
    assert schema.names == ["doc_id", "embedding", "num_tokens", "error"]
    assert schema.field("embedding").type == pa.list_(pa.float32(), 384)
    assert schema.field("embedding").nullable
    assert schema.field("num_tokens").type == pa.int32()


def test_embed_as_float16():
    schema = output_schema("embed", ID, dimensions=64, embedding_dtype="float16")
    assert schema.field("embedding").type == pa.list_(pa.float16(), 64)
    with pytest.raises(ValueError, match="embedding_dtype"):
        output_schema("embed", ID, dimensions=64, embedding_dtype="int8")


@pytest.mark.parametrize("embedding_dtype, value_type", [("float32", pa.float32()), ("float16", pa.float16())])
def test_embed_with_a_width_per_row_is_a_plain_list(embedding_dtype, value_type):
    schema = output_schema("embed", ID, dimensions=384, embedding_dtype=embedding_dtype, dimensions_per_row=True)
    assert schema.field("embedding").type == pa.list_(value_type)
    with pytest.raises(ValueError, match="only to embed"):
        output_schema("generate", ID, dimensions_per_row=True)


def test_generate_keeps_the_id_name_and_type():
    schema = output_schema("generate", pa.field("key", pa.string()))
    assert schema == pa.schema([
        ("key", pa.string()), ("text", pa.string()), ("finish_reason", pa.string()),
        ("num_prompt_tokens", pa.int32()), ("num_output_tokens", pa.int32()), ("error", pa.string()),
    ])


def test_transcribe():
    schema = output_schema("transcribe", ID)
    assert schema.names == ["doc_id", "text", "segments", "language", "language_probability", "duration_s", "error"]
    segment = schema.field("segments").type.value_type
    word = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()),
                      ("probability", pa.float64())])
    assert [(f.name, f.type) for f in segment] == [("start", pa.float64()), ("end", pa.float64()),
                                                   ("text", pa.string()), ("words", pa.list_(word))]
    assert schema.field("language_probability").type == pa.float64()
    assert schema.field("duration_s").type == pa.float64()


@pytest.mark.parametrize("mode, id_field, dimensions, problem", [
    ("embed", ID, None, "embed needs dimensions"),
    ("embed", ID, 0, "embed needs dimensions"),
    ("generate", ID, 8, "dimensions applies only to embed"),
    ("translate", ID, None, "mode 'translate' is not one of"),
    ("generate", pa.field("text", pa.string()), None, "id column name 'text' clashes"),
    ("embed", pa.field("error", pa.string()), 4, "id column name 'error' clashes"),
    ("score", pa.field("score", pa.float64()), None, "id column name 'score' clashes"),
])
def test_bad_arguments_name_the_value(mode, id_field, dimensions, problem):
    with pytest.raises(ValueError, match=problem):
        output_schema(mode, id_field, dimensions=dimensions)


def test_classify_has_the_best_label_its_score_and_the_labels_over_the_threshold():
    schema = output_schema("classify", ID)
    assert schema == pa.schema([("doc_id", pa.int64()), ("label", pa.string()), ("score", pa.float64()),
                                ("labels", pa.list_(pa.string())), ("num_tokens", pa.int32()), ("error", pa.string())])


def test_classify_with_all_scores_adds_every_labels_score_before_num_tokens():
    schema = output_schema("classify", ID, all_scores=True)
    assert schema.names == ["doc_id", "label", "score", "labels", "scores", "num_tokens", "error"]
    assert schema.field("scores").type == pa.list_(pa.struct([("label", pa.string()), ("score", pa.float64())]))
    with pytest.raises(ValueError, match="all_scores applies only to classify"):
        output_schema("score", ID, all_scores=True)


def test_score_has_the_score_and_the_tokens_it_cost():
    assert output_schema("score", pa.field("pair_id", pa.string())) == pa.schema([
        ("pair_id", pa.string()), ("score", pa.float64()), ("num_tokens", pa.int32()), ("error", pa.string())])
