"""The API's keys, files and batches on a real SQLite file and a real PostgreSQL
(migration 0012): keys kept hashed and revocable, files and batches seen only by their
owner, cursor pages newest first, a batch settled once."""

import hashlib

from jobs.api_batches import ApiBatches, BatchRecord, new_batch_id
from jobs.api_files import ApiFiles
from jobs.api_keys import ApiKeys
from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 (fixtures)


def test_a_key_is_stored_hashed_and_stops_working_when_revoked(store):
    keys = ApiKeys(store.engine)
    created = keys.create("analytics")
    with store.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT secret_sha256 FROM barge_api_keys").scalar_one()
    assert stored == hashlib.sha256(created.secret.encode()).hexdigest() and created.secret not in stored
    assert keys.authenticate(created.secret).id == created.key.id
    assert keys.authenticate(created.secret + "x") is None and keys.authenticate("' OR 1=1 --") is None
    assert keys.revoke(created.key.id) and not keys.revoke(created.key.id)
    assert keys.authenticate(created.secret) is None


def test_files_are_their_owners_only(store, tmp_path):
    keys = ApiKeys(store.engine)
    alice, bob = keys.create("alice").key.id, keys.create("bob").key.id
    files = ApiFiles(store.engine, str(tmp_path / "api"))
    record = files.create(alice, "batch", "../../etc/passwd", b'{"a": 1}\n')
    assert files.content(files.get(alice, record.id)) == b'{"a": 1}\n'
    assert (tmp_path / "api" / "files" / record.id).is_file()   # the filename is a label, never a path
    assert files.get(bob, record.id) is None and not files.delete(bob, record.id)
    assert files.get(alice, "../" + record.id) is None
    newer = files.create(alice, "batch", "b.jsonl", b"{}\n")
    assert [[f.id for f in page] for page, _ in (files.list(alice, limit=1), files.list(alice, after=newer.id))] == [
        [newer.id], [record.id]]
    assert files.list(alice, limit=1)[1] and files.list(bob) == ([], False)
    assert files.delete(alice, record.id) and files.get(alice, record.id) is None
    assert not (tmp_path / "api" / "files" / record.id).exists()


def test_batches_page_newest_first_and_settle_once(store):
    keys = ApiKeys(store.engine)
    alice, bob = keys.create("alice").key.id, keys.create("bob").key.id
    batches = ApiBatches(store.engine)
    made = [batches.create(BatchRecord(id=new_batch_id(), key_id=alice, job_id=None, endpoint="/v1/embeddings",
                                       model="minilm", input_file_id="file-" + "0" * 24, completion_window="24h",
                                       num_requests=1, created_at=1000.0 + i)).id for i in range(5)]
    page, has_more = batches.list(alice, after=None, limit=2)
    assert [b.id for b in page] == made[::-1][:2] and has_more
    page, has_more = batches.list(alice, after=page[-1].id, limit=10)
    assert [b.id for b in page] == made[::-1][2:] and not has_more
    assert batches.list(bob, after=None, limit=10) == ([], False) and batches.get(bob, made[0]) is None
    assert batches.settle(made[0], output_file_id="file-a", error_file_id=None, num_completed=1, num_failed=0,
                          usage={"input_tokens": 7, "output_tokens": 0})
    assert not batches.settle(made[0], output_file_id="file-b", error_file_id=None, num_completed=1, num_failed=0)
    settled = batches.get(alice, made[0])
    assert (settled.output_file_id, settled.usage) == ("file-a", {"input_tokens": 7, "output_tokens": 0})
