"""The errors file: failed rows as JSON lines, written before the commit that lists it."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import storage.manifest as manifest_module
from storage import (ErrorsFileInfo, Manifest, OutputError, commit_output, encode_schema, read_errors,
                     read_results, resolve, write_errors_file, write_part)
from storage.clear import clear_output
from storage.errors_file import ERRORS_NAME
from storage.manifest import MANIFEST_NAME, SUCCESS_NAME


def results(ids: list[int], errors: list[str | None]) -> pa.Table:
    return pa.table({"doc_id": pa.array(ids, pa.int64()),
                     "text": pa.array([None if e else f"out {i}" for i, e in zip(ids, errors)], pa.string()),
                     "error": pa.array(errors, pa.string())})


def manifest_of(parts, errors_file: ErrorsFileInfo | None) -> Manifest:
    return Manifest(job_id="j", mode="generate", model="m", spec={}, parts=tuple(parts),
                    schema=encode_schema(results([], []).schema), stats={}, created_at="2026-12-01T00:00:00Z",
                    errors_file=errors_file)


@pytest.fixture
def output_with_parts(tmp_path):
    output = str(tmp_path / "out")
    parts = [write_part(output, "part-00000-00000.parquet", results([0, 1, 2], [None, "too long", None])),
             write_part(output, "part-00000-00001.parquet", results([3, 4], [None, None])),
             write_part(output, "part-00001-00002.parquet", results([5, 6], ["bad audio", "null input"]))]
    return output, parts


def test_errors_file_lists_failed_rows_in_result_order(output_with_parts):
    output, parts = output_with_parts

    errors = write_errors_file(output, parts, id_column="doc_id")

    with open(os.path.join(output, ERRORS_NAME), encoding="utf-8") as file:
        lines = [json.loads(line) for line in file]
    assert lines == [{"id": 1, "error": "too long"}, {"id": 5, "error": "bad audio"}, {"id": 6, "error": "null input"}]
    assert (errors.name, errors.num_rows) == (ERRORS_NAME, 3)


def test_committed_manifest_lists_the_errors_file_and_read_errors_returns_it(output_with_parts):
    output, parts = output_with_parts
    errors = write_errors_file(output, parts, id_column="doc_id")
    manifest = manifest_of(parts, errors)

    commit_output(output, manifest)

    assert Manifest.from_json(manifest.to_json()) == manifest
    assert [row["id"] for row in read_errors(output)] == [1, 5, 6]
    assert read_results(output).num_rows == 7  # the parts keep every row, failed ones included


def test_no_failed_rows_give_an_empty_errors_file(output_with_parts):
    output, parts = output_with_parts
    errors = write_errors_file(output, parts[1:2], id_column="doc_id")
    commit_output(output, manifest_of(parts[1:2], errors))
    assert errors.num_rows == 0 and errors.num_bytes == 0 and read_errors(output) == []


def test_errors_file_is_written_before_the_manifest_and_success(output_with_parts, monkeypatch):
    output, parts = output_with_parts
    errors = write_errors_file(output, parts, id_column="doc_id")
    seen = []
    real_write = manifest_module.write_bytes_atomic

    def recording_write(out, name, data, storage_options=None):
        seen.append((name, os.path.exists(os.path.join(out, ERRORS_NAME))))
        real_write(out, name, data, storage_options)

    monkeypatch.setattr(manifest_module, "write_bytes_atomic", recording_write)
    commit_output(output, manifest_of(parts, errors))
    assert seen == [(MANIFEST_NAME, True), (SUCCESS_NAME, True)]


def test_commit_refuses_a_listed_errors_file_that_is_missing(output_with_parts):
    output, parts = output_with_parts
    errors = write_errors_file(output, parts, id_column="doc_id")
    os.remove(os.path.join(output, ERRORS_NAME))
    with pytest.raises(OutputError, match=r"parts missing or of the wrong size: \['errors.jsonl'\]"):
        commit_output(output, manifest_of(parts, errors))


def test_manifests_without_an_errors_file_still_parse_and_say_so(output_with_parts):
    output, parts = output_with_parts
    body = json.loads(manifest_of(parts, None).to_json())
    del body["errors_file"]  # as written before errors files existed
    assert Manifest.from_json(json.dumps(body)).errors_file is None
    commit_output(output, manifest_of(parts, None))
    with pytest.raises(OutputError, match="the job wrote no errors file"):
        read_errors(output)


def test_clear_output_removes_the_errors_file(output_with_parts):
    output, parts = output_with_parts
    commit_output(output, manifest_of(parts, write_errors_file(output, parts, id_column="doc_id")))
    assert clear_output(output) == 2 + 1 + 3
    assert os.listdir(output) == []


def test_only_the_id_and_error_columns_are_read(tmp_path, monkeypatch):
    # Given a part over memory:// whose text column dwarfs its id and error columns
    output = f"memory://{tmp_path.name}/out"
    big_text = [os.urandom(20_000).hex() for _ in range(100)]
    table = pa.table({"doc_id": list(range(100)), "text": big_text, "error": ["x" if i % 10 else None for i in range(100)]})
    part = write_part(output, "part-00000-00000.parquet", table)
    fs, _ = resolve(output)
    bytes_read = [0]
    real_open = fs._open

    def counting_open(path, mode="rb", **kwargs):
        file = real_open(path, mode, **kwargs)
        real_read = file.read

        def read(size=-1):
            chunk = real_read(size)
            bytes_read[0] += len(chunk)
            return chunk
        file.read = read
        return file

    monkeypatch.setattr(fs, "_open", counting_open)
    # When the errors file is written, then a small fraction of the part is read
    errors = write_errors_file(output, [part], id_column="doc_id")
    assert errors.num_rows == 90
    assert 0 < bytes_read[0] < part.num_bytes / 20
    fs.rm(output, recursive=True)
