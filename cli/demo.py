"""`barge demo`: one embedding job end to end on this machine, with nothing configured.

    barge demo                 # 10,000 rows through the built-in all-MiniLM-L6-v2
    barge demo --rows 300

It builds a sample corpus of real English text found on the machine (`jobs.corpus`),
starts a local webhook receiver (a thread) and a worker (a child process), submits the
job through the Python client, follows it with a progress bar, then prints where the
output is, the row counts, the throughput and the webhook it received (signature
verified). Everything lives under `<data dir>/demo`; the worker is stopped on the way
out, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from jobs.settings import Settings

WORKER_STOP_GRACE_S = 5.0
WEBHOOK_WAIT_S = 60.0
LOG_TAIL_LINES = 30


def add_commands(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser("demo", help="run a demo embedding job end to end on this machine")
    demo.add_argument("--rows", type=int, default=10_000)
    demo.add_argument("--model", default="minilm")
    demo.set_defaults(func=_demo)


def _demo(args) -> int:
    return run_demo(num_rows=args.rows, model=args.model)


@dataclass(frozen=True)
class Delivery:
    """One POST the receiver got: its payload if the signature verified, else why not."""

    headers: dict[str, str]
    body: bytes
    payload: dict | None
    error: str | None

    @property
    def verified(self) -> bool:
        return self.error is None


class DemoWebhookReceiver:
    """An HTTP server on 127.0.0.1 (a free port, in a thread) that verifies each POST with
    `webhooks.verify`: 200 for a good signature, 401 (the sender retries) for a bad one."""

    def __init__(self, secret: str, path: str = "/barge-demo/hook"):
        self.secret = secret
        self.path = path
        self.deliveries: list[Delivery] = []
        self._cond = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "receiver not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.path}"

    def start(self) -> DemoWebhookReceiver:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="barge-demo-webhooks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait_verified(self, timeout_s: float) -> Delivery | None:
        """The first delivery whose signature verified, or None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                good = [d for d in self.deliveries if d.verified]
                if good:
                    return good[0]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def _receive(self, headers: dict[str, str], body: bytes) -> int:
        from webhooks import WebhookVerificationError, verify
        try:
            payload, error = verify(self.secret, headers, body), None
        except WebhookVerificationError as exc:
            payload, error = None, str(exc)
        with self._cond:
            self.deliveries.append(Delivery(headers=headers, body=body, payload=payload, error=error))
            self._cond.notify_all()
        return 200 if error is None else 401

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != receiver.path:
                    status = 404
                else:
                    status = receiver._receive({k.lower(): v for k, v in self.headers.items()}, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args) -> None:
                pass

        return Handler


class WorkerProcess:
    """`barge worker --model MODEL` as a child process, its output in a log file."""

    def __init__(self, model: str, settings: Settings, log_path: Path):
        self.model = model
        self.settings = settings
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> WorkerProcess:
        env = dict(os.environ)
        env.update({
            "BARGE_DATA_DIR": str(self.settings.data_dir),
            "BARGE_DATABASE_URL": self.settings.database_url,
            "BARGE_BROKER_URL": self.settings.broker_url,
            # Deliveries refuse loopback unless allowed; only the worker delivers.
            "BARGE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
        })
        env.setdefault("BARGE_DISPATCH_INTERVAL_S", "1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C at the terminal reaches the demo, which stops the
            # worker itself (and waits for it), instead of both racing to shut down.
            self.process = subprocess.Popen([sys.executable, "-m", "cli", "worker", "--model", self.model],
                                            env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace_s: float = WORKER_STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; always reaps the process."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            process.wait()

    def _signal(self, sig: int) -> None:
        # The worker is alone in its process group (start_new_session); signalling the
        # group also reaches anything it started, and nothing else.
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                self.process.send_signal(sig)
            except ProcessLookupError:
                pass

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"


class _WorkerDied(Exception):
    pass


def run_demo(num_rows: int = 10_000, model: str = "minilm") -> int:
    """Run the demo; 0 when the job succeeded with every row and the webhook verified."""
    from jobs.corpus import CorpusTooSmall, build_corpus

    settings = Settings.from_env()
    demo_dir = settings.data_dir / "demo"
    corpus_dir, output_dir = demo_dir / "corpus", demo_dir / "output"
    say = _printer()

    say(f"data dir: {settings.data_dir}")
    say(f"building a corpus of {num_rows:,} sentences of English text found on this machine ...")
    started = time.monotonic()
    try:
        corpus = build_corpus(corpus_dir, num_rows)
    except CorpusTooSmall as exc:
        print(f"barge demo: {exc}", file=sys.stderr)
        return 1
    say(f"corpus: {corpus.num_rows:,} rows from {corpus.sources} source files, {len(corpus.files)} Parquet files, "
        f"{corpus.num_row_groups} row groups in {corpus_dir} ({time.monotonic() - started:.1f} s)")

    from webhooks import generate_secret
    secret = generate_secret()
    receiver = DemoWebhookReceiver(secret).start()
    worker = WorkerProcess(model, settings, demo_dir / "worker.log")
    submitted: list = []    # the job, once submitted
    try:
        worker.start()
        say(f"worker: pid {worker.pid}, serving {model!r}, log {worker.log_path}")
        say(f"webhook receiver: {receiver.url}")
        return _run_job(settings, corpus, output_dir, model, receiver, secret, worker, say, submitted)
    except KeyboardInterrupt:
        print("\nbarge demo: interrupted", file=sys.stderr)
        return 130
    finally:
        _cancel_unfinished(submitted)
        worker.stop()
        receiver.stop()


def _run_job(settings, corpus, output_dir: Path, model: str, receiver: DemoWebhookReceiver, secret: str,
             worker: WorkerProcess, say, started_jobs: list) -> int:
    import pyarrow.compute as pc

    from jobs.client import Client
    from jobs.spec import JobSpec
    from jobs.status import JobStatus
    from storage.manifest import read_manifest

    client = Client(settings=settings)
    spec = JobSpec(mode="embed", model=model, input=str(corpus.folder), input_column="text", id_column="doc_id",
                   output=str(output_dir), webhook_url=receiver.url, if_exists="replace",
                   metadata={"demo": True})
    submitted = time.monotonic()
    job = client.submit(spec, webhook_secret=secret)
    started_jobs.append(job)
    say(f"job {job.id} submitted; waiting (the first rows wait for the worker to load the model) ...")

    # Generous: minutes of model loading plus slow CPUs, and still an end.
    timeout_s = 600 + 0.5 * corpus.num_rows
    try:
        state = _wait_watching_worker(job, worker, timeout_s)
    except _WorkerDied:
        print(f"barge demo: the worker exited (code {worker.exit_code()}) before the job finished; "
              f"last lines of {worker.log_path}:\n{worker.log_tail()}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"barge demo: job {job.id} did not finish within {timeout_s:.0f} s; "
              f"last lines of {worker.log_path}:\n{worker.log_tail()}", file=sys.stderr)
        return 1
    wall_s = time.monotonic() - submitted

    if state.status != JobStatus.SUCCEEDED:
        print(f"barge demo: job {job.id} ended {state.status}" + (f": {state.error}" if state.error else "")
              + f"\nlast lines of {worker.log_path}:\n{worker.log_tail()}", file=sys.stderr)
        return 1

    table = job.results()
    if table.num_rows != corpus.num_rows:
        print(f"barge demo: the results have {table.num_rows} rows, the corpus {corpus.num_rows}", file=sys.stderr)
        return 1
    tokens = pc.sum(table["num_tokens"]).as_py() or 0
    manifest = read_manifest(state.output)
    run_s = (state.finished_at - state.started_at) if state.finished_at and state.started_at else None

    say(f"job {job.id}: {state.status}")
    say(f"  output:     {state.output} ({len(manifest.parts)} part files in the manifest)")
    say(f"  rows:       {state.rows_total:,} total, {state.rows_succeeded:,} succeeded, {state.rows_failed:,} failed")
    say(f"  wall time:  {wall_s:.1f} s from submission"
        + (f" ({run_s:.1f} s running after planning)" if run_s is not None else ""))
    say(f"  throughput: {table.num_rows / wall_s:,.1f} rows/s, {tokens / wall_s:,.0f} tokens/s "
        f"({tokens:,} tokens)")

    delivery = receiver.wait_verified(WEBHOOK_WAIT_S)
    if delivery is None:
        failed = [d.error for d in receiver.deliveries if not d.verified]
        why = f"{len(failed)} deliveries failed verification: {failed[-1]}" if failed else "nothing arrived"
        print(f"barge demo: no verified webhook within {WEBHOOK_WAIT_S:.0f} s after the job finished ({why}); "
              f"last lines of {worker.log_path}:\n{worker.log_tail()}", file=sys.stderr)
        return 1
    data = delivery.payload.get("data", {})
    rows = data.get("rows", {})
    say(f"  webhook:    {delivery.payload.get('type')} received, signature verified "
        f"(id {delivery.headers.get('webhook-id')}); payload status {data.get('status')}, rows "
        f"{rows.get('total')} total / {rows.get('succeeded')} succeeded / {rows.get('failed')} failed")
    say(f"  metadata:   {json.dumps(data.get('metadata'))}")
    return 0


def _wait_watching_worker(job, worker: WorkerProcess, timeout_s: float):
    """`job.wait(progress=True)`, cut short (`_WorkerDied`) when the worker process exits."""
    from jobs.client import Job

    class WatchedJob(Job):
        def status(self):
            # wait() asks for the status on every poll: the place to notice a dead worker.
            if worker.exit_code() is not None:
                raise _WorkerDied()
            return super().status()

    return WatchedJob(job.client, job.id, webhook_secret=job.webhook_secret).wait(timeout_s, progress=True)


def _cancel_unfinished(submitted: list) -> None:
    """Cancel a job the demo gave up on, so its queued shards do not hold up the next demo's worker."""
    for job in submitted:
        try:
            if not job.status().is_finished and job.cancel():
                print(f"barge demo: job {job.id} cancelled", file=sys.stderr)
        except Exception as exc:   # cleanup must not hide the real outcome
            print(f"barge demo: could not cancel job {job.id}: {exc}", file=sys.stderr)


def _printer():
    def say(line: str) -> None:
        print(line, flush=True)
    return say
