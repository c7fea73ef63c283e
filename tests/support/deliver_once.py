"""One delivery attempt in its own process, so a test can SIGKILL it mid-attempt:

    python -m tests.support.deliver_once DATABASE_URL EVENT_ID READ_TIMEOUT_S LEASE_MARGIN_S
"""

from __future__ import annotations

import sys

from jobs.store import Store
from queueing.dispatch import deliver_event
from webhooks.retry import RetryPolicy


def main(database_url: str, event_id: str, read_timeout_s: str, lease_margin_s: str) -> None:
    policy = RetryPolicy(base_s=0.05, cap_s=1.0, connect_timeout_s=1.0, read_timeout_s=float(read_timeout_s),
                         lease_margin_s=float(lease_margin_s))
    print("delivered" if deliver_event(Store(database_url), event_id, policy, allow_hosts=("127.0.0.1",))
          else "not delivered", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
