"""Input layouts through whole jobs, a separate worker process and real services: a mixed
folder over a real S3 API server (empty files, one-row files, a row group bigger than a
shard, many small row groups) with the bytes served counted per object; a worker SIGKILLed
while it holds a shard packed from many files; text columns of every type writers use;
null and duplicate ids."""

from __future__ import annotations

import json
import math
import random
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli.main import main as barge
from jobs import JobSpec, JobStatus, ShardStatus
from jobs.spec import JobSpecError
from tests.e2e.test_distributed_e2e import FAST_RECOVERY, assert_every_row_once, running_shard, wait_until
from tests.support.stack import stack


def rows(start: int, num_rows: int, text_type: pa.DataType = pa.string()) -> pa.Table:
    ids = list(range(start, start + num_rows))
    texts = pa.array([f"Barge {i} carries grain down the river." for i in ids]).cast(text_type)
    return pa.table({"doc_id": pa.array(ids, pa.int64()), "text": texts})


WORDS = ("barge river cargo engine harbor lock canal tide rope deck steel grain coal timber crane quay "
         "pilot ballast hull keel stern bow mooring towpath weir sluice lighter tug freight").split()


def long_rows(start: int, num_rows: int) -> pa.Table:
    """About 150 bytes of varied text a row, as in a real corpus: the id column and the
    footers are then the small share of a file's bytes they are in practice."""
    ids = list(range(start, start + num_rows))
    texts = [" ".join(random.Random(i).choices(WORDS, k=25)) for i in ids]
    return pa.table({"doc_id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())})


def write_mixed_folder(fs, root: str) -> tuple[int, str]:
    """Empty files, one-row files, one row group bigger than a shard, many small row groups."""
    def put(name: str, table: pa.Table, **options) -> None:
        with fs.open(f"{root}/{name}", "wb") as file:
            pq.write_table(table, file, **options)
    put("a-empty.parquet", long_rows(0, 0))
    put("b-huge.parquet", long_rows(0, 6000), row_group_size=6000)
    for i in range(40):
        put(f"c-one-{i:02d}.parquet", long_rows(6000 + i, 1))
    put("d-empty.parquet", long_rows(0, 0))
    put("e-small-groups.parquet", long_rows(6040, 1000), row_group_size=50)
    return 7040, f"{root}/b-huge.parquet"


def test_a_mixed_folder_over_s3_lands_every_id_once_and_the_huge_row_group_is_fetched_once(tmp_path, monkeypatch,
                                                                                            capsys):
    import s3fs
    from tests.integration.s3server import S3Server
    from tests.support.faulty_proxy import FaultyProxy
    with S3Server() as s3, FaultyProxy(s3.endpoint_url) as proxy:
        s3.create_bucket("corpus")
        fs = s3fs.S3FileSystem(**s3.storage_options)
        num_rows, huge = write_mixed_folder(fs, "corpus/mixed")
        credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_ENDPOINT_URL": proxy.endpoint_url, "AWS_DEFAULT_REGION": "us-east-1"}
        for name, value in credentials.items():   # the client's own checks read S3 too
            monkeypatch.setenv(name, value)
        with stack("embedded", tmp_path / "barge", credentials) as deployment:
            deployment.start_worker()
            client = deployment.client()
            job = client.submit(JobSpec(mode="embed", model="minilm", input="s3://corpus/mixed/", id_column="doc_id",
                                        output="s3://corpus/mixed-out/", max_rows_per_shard=1000))
            assert job.wait(timeout=300).status == JobStatus.SUCCEEDED, deployment.worker_logs()
            ids = job.results().column("doc_id").to_pylist()
            shards = client.store.list_shards(job.id)
            for name, value in deployment.env.items():   # `barge status` finds this deployment
                monkeypatch.setenv(name, value)
            capsys.readouterr()
            assert barge(["status", job.id]) == 0
            status = capsys.readouterr().out
        # The plan in `barge status`, as planning found it (the same text as `barge submit --dry-run`).
        assert "  plan:\n    input: 44 files (2 empty), 7,040 rows" in status, status
        assert "row groups: 63, the largest 6,000 rows" in status   # 1 + 40 + 20, and the empty files' one each
        assert f"shards: {len(shards)} (one output part each); 40 files packed several to a shard" in status
        assert "row groups bigger than a shard: 1 (each read once into staged files" in status
        assert sorted(ids) == list(range(num_rows))
        assert len(shards) <= math.ceil(num_rows / 1000) + 2
        assert len(fs.glob("corpus/mixed-out/part-*.parquet")) == len(shards)
        assert not fs.exists(f"corpus/mixed-out/_barge_staging/{job.id}"), "staging removed at the commit"
        served, size = proxy.bytes_served(f"/{huge}"), fs.size(huge)
        print(f"\nthe 6,000-row row group ({size:,} bytes) was served {served:,} bytes ({served / size:.2f}x)")
        assert served <= 1.3 * size
        tiny_served = proxy.bytes_served("/corpus/mixed/c-one-")
        tiny_size = sum(info["size"] for info in fs.ls("corpus/mixed", detail=True) if "/c-one-" in info["name"])
        all_served = proxy.bytes_served("/corpus/mixed/")
        all_size = sum(info["size"] for info in fs.ls("corpus/mixed", detail=True))
        print(f"the 40 one-row files ({tiny_size:,} bytes) were served {tiny_served:,} bytes; the whole folder "
              f"({all_size:,} bytes) {all_served:,} bytes ({all_served / all_size:.2f}x)")
        assert tiny_served == tiny_size, "each one-row file fetched once, whole, at submit (storage.bundle)"
        assert all_served <= 1.3 * all_size


def test_a_worker_killed_holding_a_packed_shard_loses_and_duplicates_nothing(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(300):   # 300 files of 4 rows: shards of 400 rows, each packed from 100 files
        pq.write_table(rows(4 * f, 4), corpus / f"f{f:04d}.parquet")
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        first = deployment.start_worker()
        client = deployment.client()
        job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                    output=str(tmp_path / "out"), max_rows_per_shard=400))
        shard = wait_until(lambda: running_shard(client, job), what="a running shard")
        assert len(shard.plan["pieces"]) == 100
        first.send_signal(signal.SIGKILL)
        first.wait()
        deployment.start_worker()
        state = job.wait(timeout=240)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert_every_row_once(job, 1200, tmp_path / "out")
        shards = client.store.list_shards(job.id)
        assert len(shards) == 3 and all(s.status == ShardStatus.COMMITTED for s in shards)
        assert any(s.attempt == 2 for s in shards), "the killed worker's shard ran again"


@pytest.fixture
def deployment(tmp_path):
    with stack("embedded", tmp_path / "barge") as deployment:
        deployment.start_worker()
        yield deployment


def run(deployment, tmp_path, table: pa.Table, name: str, **fields):
    (tmp_path / name).mkdir()
    pq.write_table(table, tmp_path / name / "in.parquet")
    job = deployment.client().submit(JobSpec(mode="embed", model="minilm", input=str(tmp_path / name),
                                             id_column="doc_id", output=str(tmp_path / f"{name}-out"), **fields))
    return job, job.wait(timeout=180)


def test_text_of_every_type_and_null_ids_become_rows_or_row_errors(deployment, tmp_path):
    plain_job, _ = run(deployment, tmp_path, rows(0, 6), "plain")
    expected = plain_job.results().column("embedding").to_pylist()
    for name, text_type in (("category", pa.dictionary(pa.int8(), pa.string())), ("view", pa.string_view()),
                            ("binary", pa.binary())):
        job, state = run(deployment, tmp_path, rows(0, 6, text_type), name)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert job.results().column("embedding").to_pylist() == expected, name

    table = pa.table({"doc_id": pa.array([10, None, 12], pa.int64()),
                      "text": pa.array([b"fine", b"also fine", b"\xff\xfe not utf-8"], pa.binary())})
    job, state = run(deployment, tmp_path, table, "bad-rows")
    assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
    errors = job.results().column("error").to_pylist()
    assert errors[0] is None
    assert errors[1].startswith("the id is null; the row is input row 1 (row 1 of ") and "in.parquet" in errors[1]
    assert "not UTF-8" in errors[2]
    assert (state.rows_succeeded, state.rows_failed) == (1, 2)


def test_duplicate_ids_refuse_the_job_at_submit_naming_them_unless_allowed(deployment, tmp_path):
    table = pa.table({"doc_id": pa.array([i % 10 for i in range(50)], pa.int64()),
                      "text": [f"row {i}" for i in range(50)]})
    with pytest.raises(JobSpecError) as refused:
        run(deployment, tmp_path, table, "dup")
    assert refused.value.field == "id_column"
    assert "10 ids appear more than once (40 rows repeat an earlier row's id); the first: 0 at input rows 0, 10, 20" \
        in str(refused.value) and "allow_duplicate_ids=True" in str(refused.value)
    assert not deployment.client().jobs(), "a refused job is not recorded"

    job, state = run(deployment, tmp_path, table, "dup-allowed", allow_duplicate_ids=True)
    assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
    assert sorted(job.results().column("doc_id").to_pylist()) == sorted(i % 10 for i in range(50))
    manifest = json.loads((tmp_path / "dup-allowed-out" / "_manifest.json").read_text())
    assert manifest["stats"]["input"]["num_duplicate_ids"] == 40   # reported, allowed or not
