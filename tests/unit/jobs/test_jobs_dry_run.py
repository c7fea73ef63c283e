"""`barge submit --dry-run` shows the layout planning finds on real files and queues nothing;
duplicate ids refuse a job unless it allows them."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.job import submitted_spec
from cli.main import _parser, main
from jobs.spec import JobSpec, JobSpecError
from jobs.validate import check_ids, inspect_job_input


@pytest.fixture(autouse=True)
def only_builtin_models(monkeypatch, tmp_path):
    monkeypatch.delenv("BARGE_MODELS", raising=False)
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    monkeypatch.setenv("BARGE_DATA_DIR", str(tmp_path / "barge"))


@pytest.fixture
def corpus(tmp_path):
    """30 two-row files, an empty one, one 5,000-row row group; id 1 repeats in the last file."""
    folder = tmp_path / "in"
    folder.mkdir()
    for f in range(30):
        pq.write_table(pa.table({"doc_id": [2 * f, 2 * f + 1], "text": ["a b", "c d"]}), folder / f"f{f:02d}.parquet")
    pq.write_table(pa.table({"doc_id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}),
                   folder / "g-empty.parquet")
    pq.write_table(pa.table({"doc_id": list(range(100, 5100)), "text": ["x y z"] * 5000}), folder / "h-big.parquet")
    pq.write_table(pa.table({"doc_id": pa.array([1, None], pa.int64()), "text": ["x", "y"]}), folder / "z.parquet")
    return folder


def test_dry_run_prints_the_layout_and_queues_nothing(corpus, tmp_path, capsys):
    code = main(["submit", "--model", "minilm", "--input", str(corpus), "--id-column", "doc_id",
                 "--output", str(tmp_path / "out"), "--dry-run"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "input: 33 files (1 empty), 5,062 rows" in printed and "MB to be read (footers and the columns" in printed
    assert "row groups: 33, the largest 5,000 rows" in printed
    assert "shards: 3 (one output part each)" in printed
    assert "row groups bigger than a shard: 1 (each read once into staged files" in printed
    assert "ids: 1 null (error rows), duplicates: 1 ids appear more than once" in printed
    assert "queued" not in printed and not (tmp_path / "out" / "_barge_staging").exists()


def test_duplicate_ids_refuse_the_job_naming_the_field_unless_allowed(corpus, tmp_path):
    fields = dict(mode="embed", model="minilm", input=str(corpus), id_column="doc_id", output=str(tmp_path / "out"))
    info = inspect_job_input(JobSpec(**fields), summarize_ids=True)
    with pytest.raises(JobSpecError) as refused:
        check_ids(JobSpec(**fields), info)
    assert refused.value.field == "id_column"
    assert "the first: 1 at input rows 1, 5060" in str(refused.value)
    check_ids(JobSpec(**fields, allow_duplicate_ids=True), info)   # allowed: no refusal
    with pytest.raises(JobSpecError, match="allow_duplicate_ids: must be a boolean"):
        JobSpec(**fields, allow_duplicate_ids="yes")


def test_allow_duplicate_ids_maps_from_the_command_line():
    required = ["submit", "--model", "minilm", "--input", "in/", "--output", "out/"]
    assert submitted_spec(_parser().parse_args(required + ["--allow-duplicate-ids"])).allow_duplicate_ids is True
    assert submitted_spec(_parser().parse_args(required)).allow_duplicate_ids is False
