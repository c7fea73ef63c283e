"""The results cache's index in SQL (SQLite and PostgreSQL): lookups by key within a
namespace, duplicates kept once, reuse refreshing an entry, pruning by last use, a file
forgotten only under the URL found gone, a file re-pointed only from the URL it has."""

from __future__ import annotations

from tests.integration.test_store import postgres_url, store, store_url  # noqa: F401 (fixtures)

NS, OTHER = "a" * 64, "b" * 64


def keys(*names: str) -> list[str]:
    return [name.ljust(64, "0") for name in names]


def test_lookup_finds_registered_keys_of_its_namespace_only(store):
    k1, k2, k3 = keys("k1", "k2", "k3")
    store.cache_register(NS, "cache/ns/part-1.parquet", [(k1, 0), (k2, 1)], now=100.0)
    store.cache_register(OTHER, "cache/other/part-1.parquet", [(k3, 0)], now=100.0)
    hits = store.cache_lookup(NS, [k1, k2, k3, k1])
    assert {k: (h.url, h.row) for k, h in hits.items()} == {k1: ("cache/ns/part-1.parquet", 0),
                                                            k2: ("cache/ns/part-1.parquet", 1)}


def test_a_key_registered_twice_keeps_its_first_entry(store):
    [k1] = keys("k1")
    store.cache_register(NS, "first.parquet", [(k1, 3), (k1, 4)], now=100.0)
    store.cache_register(NS, "second.parquet", [(k1, 0)], now=200.0)
    assert (store.cache_lookup(NS, [k1])[k1].url, store.cache_lookup(NS, [k1])[k1].row) == ("first.parquet", 3)
    assert store.cache_size(NS) == 1


def test_many_keys_are_looked_up_in_batches(store):
    many = [f"{i:064x}" for i in range(1200)]
    store.cache_register(NS, "big.parquet", [(k, i) for i, k in enumerate(many)], now=1.0)
    hits = store.cache_lookup(NS, many)
    assert len(hits) == 1200 and hits[many[1100]].row == 1100


def test_prune_removes_entries_unused_since_and_reports_emptied_files(store):
    k1, k2, k3 = keys("k1", "k2", "k3")
    store.cache_register(NS, "old.parquet", [(k1, 0), (k2, 1)], now=100.0)
    store.cache_register(NS, "new.parquet", [(k3, 0)], now=300.0)
    store.cache_touch(NS, [k2], now=250.0)            # reused since: kept, and so is its file
    dry = store.cache_prune([NS], unused_since=200.0, dry_run=True)
    assert (dry.entries, dry.file_urls) == (1, [])
    assert store.cache_size(NS) == 3
    pruned = store.cache_prune([NS], unused_since=200.0)
    assert (pruned.entries, pruned.file_urls) == (1, [])
    assert set(store.cache_lookup(NS, [k1, k2, k3])) == {k2, k3}
    pruned = store.cache_prune([NS], unused_since=280.0)
    assert (pruned.entries, pruned.file_urls) == (1, ["old.parquet"])
    assert set(store.cache_lookup(NS, [k1, k2, k3])) == {k3}
    # the emptied file stays indexed until whoever deleted it forgets it (jobs.retention)
    assert store.cache_prune([NS], unused_since=280.0).file_urls == ["old.parquet"]
    store.cache_forget_files({pruned.files[0].id: "old.parquet"})
    assert store.cache_prune([NS], unused_since=280.0).files == []


def test_forgetting_a_file_drops_its_entries(store):
    k1, k2 = keys("k1", "k2")
    file_id = store.cache_register(NS, "gone.parquet", [(k1, 0)], now=1.0)
    store.cache_register(NS, "kept.parquet", [(k2, 0)], now=1.0)
    store.cache_forget_files({file_id: "gone.parquet"})
    assert set(store.cache_lookup(NS, [k1, k2])) == {k2}


def test_a_file_moved_meanwhile_is_not_forgotten_under_its_old_url(store):
    [k1] = keys("k1")
    file_id = store.cache_register(NS, "/host-a/cache/ns/part.parquet", [(k1, 0)], now=1.0)
    assert store.cache_move_file(file_id, "/host-a/cache/ns/part.parquet", "s3://shared/cache/ns/part.parquet")
    assert not store.cache_move_file(file_id, "/host-a/cache/ns/part.parquet", "s3://other/part.parquet")
    store.cache_forget_files({file_id: "/host-a/cache/ns/part.parquet"})   # a reader that saw the old URL
    assert store.cache_lookup(NS, [k1])[k1].url == "s3://shared/cache/ns/part.parquet"
    assert store.cache_indexed_urls(["s3://shared/cache/ns/part.parquet", "/host-a/cache/ns/part.parquet"]) == {
        "s3://shared/cache/ns/part.parquet"}
