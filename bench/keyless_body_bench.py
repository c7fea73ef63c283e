"""What a keyless 24 MB JSON body costs `barge serve`: the server's peak memory (VmHWM)
before and after, and how long until its 401, sending the whole body as fast as the
server takes it. Issue 40's figure at main d9a7a84: 344 -> 941 MB and 4.4 s.

    python bench/keyless_body_bench.py [--checkout PATH] [--repeats 3]

`--checkout` runs the server from another checkout of Barge (e.g. a `git worktree` of an
older commit) with this Python, so both are measured the same way on one machine."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BODY_BYTES = 24 << 20


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def keyless_post(port: int) -> tuple[int | None, float]:
    # many small values, as a hostile body would be: parsing one is a Python object each
    pad = b"{}," * ((BODY_BYTES - 100) // 3)
    body = b'{"input_file_id": "x", "endpoint": "e", "completion_window": "24h", "pad": [' + pad + b'{}]}'
    head = (f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(head + body)
        except OSError:   # answered and closed before the body was all taken
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except OSError:
            pass
    took = time.monotonic() - start
    return (int(answer.split()[1]) if answer.startswith(b"HTTP/") else None), took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data_dir = tempfile.mkdtemp(prefix="barge-keyless-bench-")
    port = free_port()
    env = {**os.environ, "BARGE_DATA_DIR": data_dir, "PYTHONPATH": args.checkout}
    entry_point = "cli" if (Path(args.checkout) / "cli").is_dir() else "jobs.cli"   # checkouts before cli/: jobs.cli
    server = subprocess.Popen([sys.executable, "-m", entry_point, "serve", "--port", str(port)], cwd=args.checkout,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/batches", timeout=2)
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.2)
        before = peak_rss_mb(server.pid)
        answers = [keyless_post(port) for _ in range(args.repeats)]
        after = peak_rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    times = [took for _, took in answers]
    print(f"keyless {BODY_BYTES >> 20} MB POST /v1/batches x{args.repeats} against {args.checkout}:")
    print(f"  answers: {[status for status, _ in answers]}")
    print(f"  server peak memory: {before:.0f} -> {after:.0f} MB (+{after - before:.0f} MB)")
    print(f"  time to the answer: median {statistics.median(times):.2f} s (runs: "
          f"{', '.join(f'{t:.2f}' for t in times)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
