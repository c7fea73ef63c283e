"""The chaos soak of issue 27, shortened for the test suite (bench/chaos_soak.py runs the
full one): three jobs at once over an S3 corpus (moto behind the fault proxy) on
PostgreSQL + RabbitMQ with three real worker processes, webhooks to a real receiver,
while a fixed-seed schedule plays every kind of fault once or twice: workers SIGKILLed
and SIGTERMed and restarted, RabbitMQ and PostgreSQL stopped and started, S3 503 bursts
and dropped connections, the receiver down, answering 500 and hanging.

Given the deployment and the faults, when the jobs have run, then every job succeeded
(or expired after its deadline), every input row is in its output exactly once, no stray
part is left, every final event was delivered under one webhook-id, nothing is stuck,
and no worker died on its own. The services are running again when it ends, pass or fail.
"""

from __future__ import annotations

import pytest

from tests.support import services
from tests.support.chaos_schedule import SHORT, FaultKind
from tests.support.chaos_soak import SoakConfig, run_soak

SEED = 27


@pytest.mark.postgres
@pytest.mark.rabbitmq
@pytest.mark.serial   # stops and starts the machine's PostgreSQL, RabbitMQ and Redis
@pytest.mark.skipif(not services.can_control_services(),
                    reason="needs root and the local PostgreSQL, RabbitMQ and Redis to stop and start")
def test_a_short_chaos_soak_loses_nothing_duplicates_nothing_and_strands_nothing(tmp_path):
    config = SoakConfig(seed=SEED, broker="rabbitmq", num_rows=12_000, num_files=24, rows_per_group=200,
                        rows_per_shard=200, profile=SHORT, deadline_s=600.0, timeout_s=600.0, settle_s=120.0)
    try:
        report = run_soak(config, tmp_path)
    finally:
        restarted = services.ensure_up()
    print(report.format())
    assert report.passed, report.format()
    assert report.injected_kinds == {kind.value for kind in FaultKind}, "every kind of fault happened"
    assert restarted == [], "the soak itself started again what it stopped"
