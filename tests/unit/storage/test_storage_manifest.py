"""Manifest, commit and reading results back."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pytest

from storage import (Manifest, OutputError, commit_output, encode_schema, is_committed, read_manifest,
                     read_results, write_part)
from storage.manifest import MANIFEST_NAME, SUCCESS_NAME, write_partial_manifest


def manifest_of(parts, schema: pa.Schema) -> Manifest:
    return Manifest(job_id="job-1", mode="embed", model="minilm", spec={"input": "in/*.parquet", "seed": 7},
                    parts=tuple(parts), schema=encode_schema(schema), stats={"total": 3, "failed": 0},
                    created_at="2026-12-01T00:00:00+00:00")


@pytest.fixture
def written(tmp_path, make_table):
    """An output directory with two parts (written out of order) and a stray uncommitted part."""
    output = str(tmp_path / "out")
    second = write_part(output, "part-00000-00001.parquet", make_table(4, start=5))
    first = write_part(output, "part-00000-00000.parquet", make_table(5))
    write_part(output, "part-00000-00002.parquet", make_table(9, start=100))  # not in the manifest
    return output, manifest_of([first, second], make_table(0).schema)


def test_commit_then_read_results_roundtrip(written, make_table):
    output, manifest = written

    commit_output(output, manifest)

    assert is_committed(output)
    assert read_manifest(output) == manifest
    results = read_results(output)
    assert results.equals(make_table(9))  # exactly the listed parts, in the manifest's order


def test_success_is_written_last(written, monkeypatch):
    output, manifest = written
    order = []
    import storage.manifest as manifest_module
    real_write = manifest_module.write_bytes_atomic

    def recording_write(out, name, data, storage_options=None):
        order.append((name, os.path.exists(os.path.join(out, MANIFEST_NAME))))
        real_write(out, name, data, storage_options)

    monkeypatch.setattr(manifest_module, "write_bytes_atomic", recording_write)
    commit_output(output, manifest)
    assert order == [(MANIFEST_NAME, False), (SUCCESS_NAME, True)]


def test_read_results_refuses_without_success(written):
    output, manifest = written
    assert not is_committed(output)
    with pytest.raises(OutputError, match=r"out: has no _SUCCESS; the output is not committed"):
        read_results(output)


def test_commit_refuses_missing_or_resized_parts(written, make_table):
    output, manifest = written
    ghost = write_part(output, "part-00001-00003.parquet", make_table(1))
    os.remove(os.path.join(output, ghost.name))
    with pytest.raises(OutputError, match=r"parts missing or of the wrong size: \['part-00001-00003.parquet'\]"):
        commit_output(output, manifest_of([*manifest.parts, ghost], make_table(0).schema))
    assert not is_committed(output)


def test_read_results_checks_checksums(written, make_table):
    output, manifest = written
    commit_output(output, manifest)
    write_part(output, "part-00000-00001.parquet", make_table(4, start=50))  # same size, other content
    with pytest.raises(OutputError, match="part-00000-00001.parquet does not match its checksum"):
        read_results(output)


def test_no_parts_gives_an_empty_table_with_the_schema(tmp_path, make_table):
    output = str(tmp_path / "empty")
    commit_output(output, manifest_of([], make_table(0).schema))
    results = read_results(output)
    assert results.num_rows == 0 and results.schema.names == ["doc_id", "text", "score"]


def test_manifest_json_is_readable_and_roundtrips(make_table):
    manifest = manifest_of([], make_table(0).schema)
    text = manifest.to_json()
    assert '"schema_text": "doc_id: int64' in text and '"format_version": 1' in text
    assert Manifest.from_json(text) == manifest
    assert manifest.arrow_schema.equals(make_table(0).schema)


def test_manifest_rejects_repeated_parts_and_bad_schema(written, make_table):
    _, manifest = written
    with pytest.raises(ValueError, match="lists a part twice"):
        manifest_of([manifest.parts[0], manifest.parts[0]], make_table(0).schema)
    with pytest.raises(ValueError, match="not an encode_schema"):
        Manifest(job_id="j", mode="embed", model="m", spec={}, parts=(), schema="doc_id: int64",
                 stats={}, created_at="")


def test_read_manifest_errors_name_the_output(tmp_path):
    with pytest.raises(OutputError, match="has no _manifest.json"):
        read_manifest(str(tmp_path))
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(OutputError, match="_manifest.json is not a valid manifest"):
        read_manifest(str(tmp_path))


def test_a_partial_manifest_is_read_only_when_asked_for(written, make_table):
    output, manifest = written
    expired = dataclasses.replace(manifest, status="expired", parts=manifest.parts[:1])

    write_partial_manifest(output, expired)

    assert not is_committed(output)
    with pytest.raises(OutputError, match="not committed"):
        read_results(output)
    assert read_results(output, partial=True).equals(make_table(5))   # the one part it listed
    assert read_manifest(output).status == "expired" and not read_manifest(output).is_complete


def test_a_complete_commit_replaces_a_partial_manifest(written, make_table):
    output, manifest = written
    write_partial_manifest(output, dataclasses.replace(manifest, status="cancelled", parts=manifest.parts[:1]))

    commit_output(output, manifest)   # the job was retried and finished

    assert read_manifest(output).is_complete
    assert read_results(output).equals(make_table(9))
    assert read_results(output, partial=True).equals(make_table(9))


def test_partial_reads_refuse_a_complete_manifest_without_success(written):
    output, manifest = written
    commit_output(output, manifest)
    os.remove(os.path.join(output, SUCCESS_NAME))   # a commit cut short before _SUCCESS

    with pytest.raises(OutputError, match="not committed"):
        read_results(output, partial=True)


def test_manifest_status_is_checked(written):
    _, manifest = written
    with pytest.raises(ValueError, match="status"):
        dataclasses.replace(manifest, status="running")
    with pytest.raises(ValueError, match="partial status"):
        write_partial_manifest("unused", manifest)
