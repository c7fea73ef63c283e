"""jobs.secret_box: how webhook secrets are encrypted, which keys open them, and where
the embedded store's key comes from."""

from __future__ import annotations

import stat
import threading

import pytest

from jobs.secret_box import (KEY_ENV, SecretBox, SecretKeyError, generate_key, key_file_path,
                             read_or_create_key_file)

SECRET = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="


def test_round_trip_and_ciphertext_holds_no_secret():
    box = SecretBox([generate_key()])
    stored = box.encrypt(SECRET)
    assert stored.startswith("fernet:") and SECRET not in stored and SECRET[6:] not in stored
    assert box.decrypt(stored) == SECRET
    assert box.encrypt(None) is None and box.decrypt(None) is None


def test_a_plain_secret_from_an_older_barge_reads_as_it_is():
    box = SecretBox([generate_key()])
    assert box.decrypt(SECRET) == SECRET
    assert box.decrypt(box.reencrypt(SECRET)) == SECRET


def test_during_a_rotation_both_keys_decrypt_and_the_new_one_encrypts():
    old, new = generate_key(), generate_key()
    under_old = SecretBox([old]).encrypt(SECRET)
    rotating = SecretBox([new, old])
    assert rotating.decrypt(under_old) == SECRET
    moved = rotating.reencrypt(under_old)
    assert SecretBox([new]).decrypt(moved) == SECRET
    with pytest.raises(SecretKeyError, match="cannot be decrypted"):
        SecretBox([old]).decrypt(moved)


def test_a_malformed_key_is_refused_without_being_echoed():
    with pytest.raises(SecretKeyError, match=KEY_ENV) as caught:
        SecretBox(["not-a-key-hunter2"])
    assert "hunter2" not in str(caught.value)


def test_keys_from_the_environment_newest_first():
    old, new = generate_key(), generate_key()
    box = SecretBox.for_store("postgresql+psycopg://db/barge", {KEY_ENV: f" {new} , {old} "})
    assert box.num_keys == 2 and SecretBox([new]).decrypt(box.encrypt(SECRET)) == SECRET


def test_no_key_no_store_except_sqlite(tmp_path):
    with pytest.raises(SecretKeyError, match=f"{KEY_ENV} is not set"):
        SecretBox.for_store("postgresql+psycopg://db/barge", {})
    box = SecretBox.for_store(f"sqlite:///{tmp_path / 'barge.db'}", {})
    assert box.key_file == tmp_path / "secret.key" and stat.S_IMODE(box.key_file.stat().st_mode) == 0o600
    assert SecretBox.for_store("sqlite://", {}).key_file is None   # in memory: a key of its own


@pytest.mark.parametrize("url, path", [
    ("sqlite:////data/barge/barge.db", "/data/barge/secret.key"),
    ("sqlite:///rel/barge.db?timeout=5", "rel/secret.key"),
    ("sqlite:///:memory:", None),
    ("sqlite://", None),
])
def test_key_file_path(url, path):
    found = key_file_path(url)
    assert (None if found is None else str(found)) == path


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    path = tmp_path / "secret.key"
    found, barrier = [], threading.Barrier(8)

    def start():
        barrier.wait()
        found.append(read_or_create_key_file(path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({tuple(keys) for keys in found}) == 1 and len(found[0]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.key"], "no candidate file left behind"
