"""The embedded default's broker, measured: messages per second sent by one process and
consumed by two at once, for kombu's filesystem transport, Barge's atomic one
(jobs.fs_transport) and kombu's SQLAlchemy transport on a SQLite file (the other
serverless choice). Producer and consumers run together, as a planner's burst meets
running workers, and every message is checked to arrive exactly once.

    python bench/broker_bench.py [--messages 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUEUE = "bench.queue"
BODY = "x" * 600   # about a Celery shard message's size
IDLE_S = 3.0


def connection(kind: str, folder: str):
    import jobs.messaging  # noqa: F401 - registers the barge-fs transport
    from kombu import Connection
    if kind == "sqlalchemy":
        return Connection(f"sqla+sqlite:///{folder}/broker.db")
    options = {"data_folder_in": f"{folder}/queue", "data_folder_out": f"{folder}/queue",
               "control_folder": f"{folder}/control", "polling_interval": 0.01}
    return Connection("filesystem://" if kind == "kombu-filesystem" else "barge-fs://", transport_options=options)


def produce(kind: str, folder: str, num_messages: int, start, sent, out) -> None:
    with connection(kind, folder) as conn:
        queue = conn.SimpleQueue(QUEUE)
        start.wait()
        began = time.perf_counter()
        for i in range(num_messages):
            queue.put({"i": i, "body": BODY})
        out.put(("sent", time.perf_counter() - began))
        sent.set()


def consume(kind: str, folder: str, num_messages: int, start, sent, counter, out) -> None:
    """Until every message arrived, or nothing came for IDLE_S after the last was sent
    (a message lost on the way never comes)."""
    received, errors = [], 0
    with connection(kind, folder) as conn:
        queue = conn.SimpleQueue(QUEUE)
        start.wait()
        began = last = time.perf_counter()
        while counter.value < num_messages and not (sent.is_set() and time.perf_counter() - last > IDLE_S):
            try:
                message = queue.get(timeout=0.2)
            except queue.Empty:
                continue
            except Exception:   # kombu's filesystem transport: an empty or half-written file
                errors += 1
                continue
            last = time.perf_counter()
            received.append(message.payload["i"])
            message.ack()
            with counter.get_lock():
                counter.value += 1
        out.put(("received", last - began, received, errors))


def run_once(kind: str, num_messages: int) -> dict:
    folder = tempfile.mkdtemp(prefix=f"broker-{kind}-")
    for name in ("queue", "control"):
        os.makedirs(f"{folder}/{name}")
    # Fresh processes each run: kombu's filesystem transport remembers declared exchanges
    # per process, not per folder, so a forked child would skip binding the new folder.
    ctx = mp.get_context("spawn")
    start, sent, counter, out = ctx.Event(), ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    processes = [ctx.Process(target=produce, args=(kind, folder, num_messages, start, sent, out))]
    processes += [ctx.Process(target=consume, args=(kind, folder, num_messages, start, sent, counter, out))
                  for _ in range(2)]
    for process in processes:
        process.start()
    time.sleep(5.0)   # every process connected and declared
    start.set()
    results = [out.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(timeout=10)
    send_s = next(r[1] for r in results if r[0] == "sent")
    received = [i for r in results if r[0] == "received" for i in r[2]]
    errors = sum(r[3] for r in results if r[0] == "received")
    # Until the last message arrived, from the common start.
    elapsed = max(r[1] for r in results if r[0] == "received")
    return {"sent_per_s": num_messages / send_s, "consumed_per_s": len(received) / elapsed if elapsed else 0.0,
            "lost": num_messages - len(set(received)), "duplicated": len(received) - len(set(received)),
            "consumer_errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.messages} messages, 1 producer and 2 consumers at once, median of {args.repeats}")
    print(f"{'transport':18} {'sent/s':>8} {'consumed/s':>10} {'lost':>5} {'dup':>5} {'consumer errors':>16}")
    for kind in ("kombu-filesystem", "barge-fs", "sqlalchemy"):
        runs = [run_once(kind, args.messages) for _ in range(args.repeats)]
        print(f"{kind:18} {statistics.median(r['sent_per_s'] for r in runs):8.0f} "
              f"{statistics.median(r['consumed_per_s'] for r in runs):10.0f} "
              f"{max(r['lost'] for r in runs):5d} {max(r['duplicated'] for r in runs):5d} "
              f"{sum(r['consumer_errors'] for r in runs):16d}")


if __name__ == "__main__":
    main()
