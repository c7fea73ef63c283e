"""A structured generate job's manifest counts the rows cut off at max_tokens, read from
the committed parts' finish_reason column; other jobs' manifests carry nothing new."""

import pyarrow as pa
import pyarrow.parquet as pq

from jobs import JobSpec
from queueing.structured_stats import structured_stats
from storage.write import PartInfo


def _part(folder, name, reasons):
    pq.write_table(pa.table({"text": ["x"] * len(reasons), "finish_reason": pa.array(reasons, pa.string())}),
                   folder / name, row_group_size=2)
    return PartInfo(name=name, num_rows=len(reasons), num_bytes=0, sha256="")


def _spec(output, **params):
    return JobSpec(mode="generate", model="smollm2", input="/in", output=str(output), params=params)


def test_rows_finished_length_under_a_constraint_are_counted_over_every_part(tmp_path):
    parts = [_part(tmp_path, "part-0.parquet", ["stop", "length", None, "length", "stop"]),
             _part(tmp_path, "part-1.parquet", ["length", "stop"])]
    spec = _spec(tmp_path, structured={"choice": ["a", "b"]})
    assert structured_stats(spec, parts) == {"structured": {"rows_length": 3}}


def test_unconstrained_jobs_add_nothing(tmp_path):
    parts = [_part(tmp_path, "part-0.parquet", ["length"])]
    assert structured_stats(_spec(tmp_path), parts) == {}
    assert structured_stats(_spec(tmp_path, structured=None), parts) == {}
