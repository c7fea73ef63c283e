"""top_n.parquet: read from committed parts, written atomically, listed in the manifest
(checked present at the commit, kept through a round trip) and cleared with the rest."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from storage import Manifest, OutputError, commit_output, encode_schema, read_manifest, write_part
from storage.clear import clear_output
from storage.top_n_file import TOP_N_NAME, read_part_columns, write_top_n_file

COLUMNS = pa.schema([("doc_id", pa.int64()), ("score", pa.float64())])


@pytest.fixture
def parts(tmp_path, make_table):
    output = str(tmp_path / "out")
    return output, [write_part(output, "part-00000-00000.parquet", make_table(3)),
                    write_part(output, "part-00000-00001.parquet", make_table(2, start=3))]


def test_the_columns_of_every_part_are_read_in_order(parts):
    output, written = parts
    table = read_part_columns(output, written, COLUMNS)
    assert table.schema == COLUMNS
    assert table.to_pydict() == {"doc_id": [0, 1, 2, 3, 4], "score": [0.0, 0.5, 1.0, 1.5, 2.0]}
    assert read_part_columns(output, [], COLUMNS).num_rows == 0


def test_a_missing_part_is_an_output_error_naming_it(parts):
    output, written = parts
    with pytest.raises(OutputError, match="part-00000-00009.parquet"):
        read_part_columns(output, [dataclasses.replace(written[0], name="part-00000-00009.parquet")], COLUMNS)


def test_the_manifest_lists_the_top_n_file_checks_it_and_clear_removes_it(parts, make_table):
    output, written = parts
    top = write_top_n_file(output, make_table(2))
    assert top.name == TOP_N_NAME and top.num_rows == 2
    manifest = Manifest(job_id="job-1", mode="score", model="m", spec={}, parts=tuple(written),
                        schema=encode_schema(make_table(0).schema), stats={}, created_at="2026-12-06T00:00:00Z",
                        top_n_file=top)
    commit_output(output, manifest)
    assert read_manifest(output).top_n_file == top
    assert clear_output(output) == 5     # _SUCCESS, the manifest, top_n.parquet and two parts
    with pytest.raises(OutputError, match=TOP_N_NAME):
        commit_output(output, dataclasses.replace(manifest, parts=()))
