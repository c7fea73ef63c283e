"""The embedded broker's files (jobs.fs_transport).

Given kombu's filesystem transport made safe to share, when messages are written, read,
or found unreadable, then readers never see half a file, and an unreadable one is set
aside instead of raised. Real files in a temporary folder; kombu's own channel code."""

from __future__ import annotations

import os
import threading

import pytest
from kombu import Connection, Exchange, Queue

import jobs.messaging  # noqa: F401 - registers the barge-fs transport
from jobs.fs_transport import BAD_FOLDER, bad_message_count, write_atomically


@pytest.fixture
def folders(tmp_path):
    for name in ("queue", "control"):
        (tmp_path / name).mkdir()
    return tmp_path


def connection(folders) -> Connection:
    queue = str(folders / "queue")
    return Connection("barge-fs://", transport_options={"data_folder_in": queue, "data_folder_out": queue,
                                                        "control_folder": str(folders / "control")})


def take(queue) -> dict:
    message = queue.get(timeout=1)
    message.ack()
    return message.payload


def test_messages_round_trip_and_leave_nothing_behind(folders):
    with connection(folders) as conn:
        queue = conn.SimpleQueue("q")
        for i in range(5):
            queue.put({"i": i})
        assert [take(queue)["i"] for _ in range(5)] == list(range(5))
    leftovers = [p for p in (folders / "queue").rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.parametrize("content", [b"", b'{"body": "eyJ0YXNrIjog', b"not json", b"[1, 2]",
                                     b'{"properties": {}}'])
def test_an_unreadable_message_is_set_aside_and_the_next_one_read(folders, content):
    with connection(folders) as conn:
        queue = conn.SimpleQueue("q")
        (folders / "queue" / "00000000000000000000_bad.q.msg").write_bytes(content)   # sorts first
        queue.put({"i": 1})
        assert take(queue) == {"i": 1}
    assert [p.name for p in (folders / "queue" / BAD_FOLDER).iterdir()] == ["00000000000000000000_bad.q.msg"]
    assert bad_message_count(folders / "queue") == 1


def test_a_message_file_appears_whole(tmp_path):
    """A reader polling the folder while files are written never finds a partial one."""
    target = tmp_path / "table.json"
    payload = b"x" * 200_000
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.add(len(target.read_bytes()))
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(200):
        write_atomically(target, payload)
        os.unlink(target)
    stop.set()
    reader.join()
    assert seen <= {len(payload)}
    assert [p.name for p in tmp_path.iterdir()] == [], "no temporary file left"


def test_bindings_from_several_connections_are_all_kept(folders):
    """Workers declaring their queues at the same time: no binding overwrites another."""
    def declare(i):
        with connection(folders) as conn:
            Queue(f"queue-{i}", Exchange("shared", "direct"), routing_key=f"k{i}")(conn.default_channel).declare()

    threads = [threading.Thread(target=declare, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with connection(folders) as conn:
        table = conn.default_channel.get_table("shared")
    assert sorted(binding.queue for binding in table) == [f"queue-{i}" for i in range(8)]


def test_a_backlog_is_listed_once_and_read_oldest_first_by_two_readers(folders, monkeypatch):
    """A queue of 200 messages read through two connections: each message once, each
    reader's in the order they were put, a message put meanwhile after the older ones, and
    the folder listed a few times, not once per message (which made a backlog quadratic)."""
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": listings.append(path) or real_listdir(path))
    with connection(folders) as first, connection(folders) as second:
        queues = [first.SimpleQueue("q"), second.SimpleQueue("q")]
        for i in range(200):
            queues[0].put({"i": i})
        seen = [[], []]
        for turn in range(200):
            reader = turn % 2
            seen[reader].append(take(queues[reader])["i"])
            if turn == 50:
                queues[0].put({"i": 200})
        seen[0].append(take(queues[0])["i"])
    assert sorted(seen[0] + seen[1]) == list(range(201))
    assert all(got == sorted(got) for got in seen), seen
    queue_listings = [path for path in listings if str(path) == str(folders / "queue")]
    assert len(queue_listings) <= 10, len(queue_listings)
