"""The chaos soak (issue 27): several jobs over a ≥100,000-row S3 corpus on PostgreSQL and
RabbitMQ (or Redis) with three worker processes, while a seeded schedule of faults plays:
workers SIGKILLed and SIGTERMed (and restarted), the broker and PostgreSQL restarted,
S3 503 bursts and dropped connections (moto behind tests/support/faulty_proxy.py), the
webhook receiver down for minutes, answering 500 and hanging. Then it checks that every
job ended as it should, every row is in its output exactly once, no stray part is left,
every final webhook was delivered under one webhook-id, nothing is stuck; and prints the
figures. Exit status 1 if a check failed.

    python bench/chaos_soak.py                     # the full soak, seed 1, RabbitMQ
    python bench/chaos_soak.py --broker redis --seed 2
    python bench/chaos_soak.py --profile short --rows 12000 --files 24 --rows-per-shard 200

It needs root and the machine's PostgreSQL, RabbitMQ and Redis (it stops and starts
them: run it where no one else's tests are using them), and restarts whatever it stopped
before it exits, whatever happens. Rows are embedded by a tiny random-weight BERT
(tests/support/random_embedders.py): the soak tests the system, not the model.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests.support, run from anywhere

from bench.machine import cpu_model   # noqa: E402
from tests.support.chaos_schedule import FULL, SHORT   # noqa: E402
from tests.support.chaos_soak import SoakConfig, run_soak   # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--broker", choices=("rabbitmq", "redis"), default="rabbitmq")
    parser.add_argument("--rows", type=int, default=120_000)
    parser.add_argument("--files", type=int, default=120)
    parser.add_argument("--rows-per-shard", type=int, default=500)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--profile", choices=("full", "short"), default="full")
    parser.add_argument("--deadline-s", type=float, default=1200.0,
                        help="expires_after_s of the job with a deadline")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "BARGE_SECRET_KEY" not in os.environ:   # PostgreSQL stores open only with one
        from cryptography.fernet import Fernet
        os.environ["BARGE_SECRET_KEY"] = Fernet.generate_key().decode()
    config = SoakConfig(seed=args.seed, broker=args.broker, num_rows=args.rows, num_files=args.files,
                        rows_per_group=args.rows_per_shard, rows_per_shard=args.rows_per_shard,
                        num_workers=args.workers, profile=FULL if args.profile == "full" else SHORT,
                        deadline_s=args.deadline_s, timeout_s=args.timeout_s)
    # A SIGTERM ends the run through its finally blocks: workers stopped, services started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="barge-soak-"))
    print(f"chaos soak: seed {config.seed}, {config.broker}, {config.num_workers} workers, {args.profile} faults, "
          f"{cpu_model()}, work dir {work_dir}", flush=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    report = run_soak(config, work_dir, log=lambda line: print(line, flush=True))
    print(f"started {started}, command: python {' '.join(sys.argv)}")
    print(report.format())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
