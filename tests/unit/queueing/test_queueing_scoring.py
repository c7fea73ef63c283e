"""A classify or score shard on the worker's side, with fabricated engine outputs: its
inputs read from a table, its outputs as the part's columns, and the top-N file ranked
from committed parts and written the same on every finalize."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.score.outputs import ClassifyResult, ScoreOutput
from engine.score.top_n import top_n
from jobs.records import JobRecord
from jobs.spec import JobSpec
from jobs.status import JobStatus
from queueing.results import build_table
from queueing.shard_rows import input_values
from queueing.top_n_output import ranked_table, wants_top_n, write_top_n
from storage.manifest import encode_schema
from storage.schemas import output_schema
from storage.plan import ShardPiece, ShardPlan
from storage.top_n_file import TOP_N_NAME
from storage.write import part_name, write_part

ID = pa.field("doc_id", pa.int64())


def spec(mode: str = "score", **params) -> JobSpec:
    return JobSpec(mode=mode, model="m", input="in.parquet", output="out/", input_column="pair", params=params)


# -- reading a shard's inputs -------------------------------------------------------------------------------------

def test_two_text_columns_become_pairs_and_a_null_document_stays_for_the_engine():
    table = pa.table({"q": ["a", "b", None], "d": pa.array([b"x", None, b"\xff"], pa.binary())})
    inputs, errors = input_values(spec(query_column="q", document_column="d"), table)
    assert inputs == [("a", "x"), ("b", None), (None, None)]
    assert list(errors) == [2] and "not UTF-8" in errors[2]


def test_one_column_of_lists_becomes_pairs_and_its_bad_rows_errors():
    table = pa.table({"pair": pa.array([["q", "d"], None, ["q", "d", "e"]], pa.list_(pa.string()))})
    inputs, errors = input_values(spec(), table)
    assert inputs == [("q", "d"), None, None]
    assert errors == {1: "pair is null", 2: "pair has 3 texts, not 2 ([query, document])"}


def test_a_chat_score_job_and_a_classify_job_read_the_column_as_it_is():
    messages = [{"role": "user", "content": "hi"}]
    table = pa.table({"pair": pa.array([messages], pa.list_(pa.struct([("role", pa.string()),
                                                                       ("content", pa.string())])))})
    assert input_values(spec(chat=True), table) == ([messages], {})
    texts = pa.table({"pair": ["a text", None]})
    assert input_values(spec("classify"), texts) == (["a text", None], {})


# -- engine outputs -> the part's columns ---------------------------------------------------------------------------

def test_classify_outputs_become_label_score_labels_and_every_labels_score():
    outputs = [ClassifyResult("positive", 0.7, ("positive",), {"negative": 0.1, "neutral": 0.2, "positive": 0.7}, 5),
               ClassifyResult(None, None, (), None, 0, "row is null"),
               ClassifyResult(None, 1.5, (), {"LABEL_0": 1.5}, 3)]              # a regression head
    schema = output_schema("classify", ID, all_scores=True)
    table = build_table("classify", pa.array([1, 2, 3]), outputs, id_column="doc_id", schema=schema)
    assert table.cast(schema).to_pylist() == [
        {"doc_id": 1, "label": "positive", "score": 0.7, "labels": ["positive"], "num_tokens": 5, "error": None,
         "scores": [{"label": "negative", "score": 0.1}, {"label": "neutral", "score": 0.2},
                    {"label": "positive", "score": 0.7}]},
        {"doc_id": 2, "label": None, "score": None, "labels": None, "scores": None, "num_tokens": 0,
         "error": "row is null"},
        {"doc_id": 3, "label": None, "score": 1.5, "labels": [], "scores": [{"label": "LABEL_0", "score": 1.5}],
         "num_tokens": 3, "error": None}]
    without = build_table("classify", pa.array([1]), outputs[:1], id_column="doc_id", schema=output_schema("classify", ID))
    assert "scores" not in without.column_names


def test_score_outputs_become_score_and_tokens():
    outputs = [ScoreOutput(0.25, 12), ScoreOutput(None, 0, "document is null")]
    schema = output_schema("score", ID)
    table = build_table("score", pa.array([1, 2]), outputs, id_column="doc_id", schema=schema)
    assert table.select(schema.names).cast(schema).to_pylist() == [
        {"doc_id": 1, "score": 0.25, "num_tokens": 12, "error": None},
        {"doc_id": 2, "score": None, "num_tokens": 0, "error": "document is null"}]


# -- top_n.parquet ----------------------------------------------------------------------------------------------------

SCORED = pa.table({"qid": pa.array(["b", "a", "b", "a", "b", "c"]), "doc_id": pa.array([0, 1, 2, 3, 4, 5], pa.int64()),
                   "score": pa.array([0.1, 0.9, 0.7, None, 0.7, None], pa.float64())})


def test_the_top_n_table_is_each_groups_best_rows_ranked_in_first_appearance_order():
    table = ranked_table(SCORED, "qid", 2)
    assert table.column_names == ["qid", "rank", "doc_id", "score"]
    assert table.schema.field("rank").type == pa.int32()
    # b's tie at 0.7 keeps input order; a's error row is never ranked; c has no scored row
    assert table.to_pylist() == [{"qid": "b", "rank": 1, "doc_id": 2, "score": 0.7},
                                 {"qid": "b", "rank": 2, "doc_id": 4, "score": 0.7},
                                 {"qid": "a", "rank": 1, "doc_id": 1, "score": 0.9}]


@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_the_top_n_table_is_engine_score_top_n(n):
    expected = top_n(SCORED.column("score").to_pylist(), SCORED.column("qid").to_pylist(), n)
    table = ranked_table(SCORED, "qid", n)
    got: dict = {}
    for row in table.to_pylist():
        got.setdefault(row["qid"], []).append(row["doc_id"])
        assert row["rank"] == len(got[row["qid"]])
    assert got == {group: rows for group, rows in expected.items() if rows}


def test_the_top_n_file_is_read_from_the_committed_parts_and_written_the_same_twice(tmp_path):
    job_spec = JobSpec(mode="score", model="m", input="in.parquet", output=str(tmp_path), id_column="doc_id",
                       params={"query_column": "q", "document_column": "d", "group_column": "qid", "top_n": 1})
    assert wants_top_n(job_spec) and not wants_top_n(spec())
    schema = pa.schema([ID, pa.field("qid", pa.string()), pa.field("score", pa.float64()),
                        pa.field("num_tokens", pa.int32()), pa.field("error", pa.string())])
    parts = []
    for index, rows in enumerate(([0, 1, 2], [3, 4, 5])):
        chunk = SCORED.take(rows)
        part = pa.table({"doc_id": chunk["doc_id"], "qid": chunk["qid"], "score": chunk["score"],
                         "num_tokens": pa.array([1] * 3, pa.int32()), "error": pa.array([None] * 3, pa.string())},
                        schema=schema)
        shard = ShardPlan(index, (ShardPiece(0, "in.parquet", (0,), 0, 3),))
        parts.append(write_part(str(tmp_path), part_name(shard), part))
    job = _record(job_spec, schema)
    first = write_top_n(job, parts)
    data = (tmp_path / TOP_N_NAME).read_bytes()
    assert write_top_n(job, parts) == first and (tmp_path / TOP_N_NAME).read_bytes() == data
    assert pq.read_table(tmp_path / TOP_N_NAME).to_pylist() == [{"qid": "b", "rank": 1, "doc_id": 2, "score": 0.7},
                                                                {"qid": "a", "rank": 1, "doc_id": 1, "score": 0.9}]
    assert (first.name, first.num_rows) == (TOP_N_NAME, 2)


def _record(job_spec: JobSpec, schema: pa.Schema) -> JobRecord:
    return JobRecord(id="job", status=JobStatus.FINALIZING, spec=job_spec, model_key="m", rows_total=6,
                     output_schema=encode_schema(schema), error=None, created_at=0.0, started_at=0.0,
                     finished_at=None)


class RecordingEngine:
    """Stands in for engine.Engine: records what each score call gets."""

    def __init__(self):
        self.calls = []

    def score(self, queries, documents, params):
        self.calls.append(("score", queries, documents, params))
        return [ScoreOutput(0.5, 1)] * len(queries)

    def score_chats(self, chats, params):
        self.calls.append(("score_chats", chats, params))
        return [ScoreOutput(1.0, 1)] * len(chats)


def test_pairs_split_into_queries_and_documents_and_chats_go_whole():
    from engine.score.params import ScoreParams
    from queueing.inference import score_rows
    engine = RecordingEngine()
    score_rows(engine, {"query_column": "q", "document_column": "d", "instruction": "x"}, [("q1", "d1"), None])
    chats = [[{"role": "user", "content": "hi"}]]
    score_rows(engine, {"chat": True, "group_column": "g", "top_n": 1}, chats)
    assert engine.calls == [("score", ["q1", None], ["d1", None], ScoreParams(instruction="x")),
                            ("score_chats", chats, ScoreParams())]
