"""The dashboard's reads and access rules over a real store (SQLite file and
PostgreSQL), through the real FastAPI app: what a key sees, what an operator (key or
login URL session) sees, that nobody sees anything by address or with a copied cookie, that the rates and shards come from the shards' rows, that workers' heartbeats
and leases show up, and that no secret is ever in a page.

The browser-level test, against a real server and worker, is tests/e2e/test_dashboard_e2e.py."""

from __future__ import annotations

import html
import re
import time

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import SESSION_COOKIE, LoginTicket
from api.dashboard.reads import MAX_JOBS
from jobs.api_batches import ApiBatches, BatchRecord, new_batch_id
from jobs.api_keys import ApiKeys
from jobs.generate_usage import AdapterUsage, GenerateUsage, Prefill
from jobs.client import Client
from jobs.settings import Settings
from jobs.worker_beats import EngineBeat, WorkerBeat, WorkerBeats
from tests.integration.test_store import make_plans, make_spec, new_job, part, postgres_url, store, store_url  # noqa: F401

LOOPBACK = ("127.0.0.1", 50000)
SAME_ORIGIN = {"Origin": "http://localhost"}
SECRET_URL = "https://hooks.example.com/T1/B2/path-token-77?sig=query-token-88"


@pytest.fixture
def served(store, tmp_path):
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"),
                                                "BARGE_DATABASE_URL": store.url}))
    keys = ApiKeys(store.engine)
    alice, bob, operator = keys.create("alice"), keys.create("bob"), keys.create("ops", operator=True)
    owned = new_job(store, webhook_url=SECRET_URL, input=["s3://AKIAOWNED:owned-s3-secret@corpus/a.parquet"])
    ApiBatches(store.engine).create(BatchRecord(id=new_batch_id(), key_id=alice.key.id, job_id=owned,
                                                endpoint="/v1/embeddings", model="minilm", input_file_id="file-x",
                                                completion_window="24h", created_at=time.time()))
    unowned = new_job(store)
    return {"client": client, "store": store, "alice": alice, "bob": bob, "operator": operator, "owned": owned,
            "unowned": unowned}


def _app(served, operator: bool = False, **options) -> TestClient:
    """The app as a loopback caller reaches it; with the operator key's header when `operator`."""
    headers = {"Authorization": f"Bearer {served['operator'].secret}"} if operator else None
    return TestClient(create_app(served["client"], **options), client=LOOPBACK, base_url="http://localhost",
                      headers=headers, follow_redirects=False)


def _listed(http: TestClient, **headers) -> set[str]:
    answer = http.get("/dashboard/api/jobs", headers=headers)
    assert answer.status_code == 200, answer.text
    return {job["id"] for job in answer.json()["jobs"]}


def test_a_key_sees_its_own_batches_jobs_only(served):
    http = _app(served)
    alice = {"Authorization": f"Bearer {served['alice'].secret}"}
    bob = {"Authorization": f"Bearer {served['bob'].secret}"}
    assert _listed(http, **alice) == {served["owned"]}
    assert _listed(http, **bob) == set()
    assert http.get(f"/dashboard/jobs/{served['owned']}", headers=bob).status_code == 404
    assert http.get(f"/dashboard/api/jobs/{served['owned']}", headers=bob).status_code == 404
    assert http.get(f"/dashboard/api/jobs/{served['unowned']}", headers=alice).status_code == 404
    page = http.get(f"/dashboard/jobs/{served['owned']}", headers=alice)
    assert page.status_code == 200 and "alice" in page.text
    assert "Content-Security-Policy" in page.headers and page.headers["Cache-Control"] == "no-store"


def test_only_an_operator_sees_everything_and_nobody_by_address(served):
    assert _listed(_app(served, operator=True)) == {served["owned"], served["unowned"]}
    http = _app(served)   # loopback, no key: what main at d9a7a84 gave the operator's view
    assert http.get("/dashboard/api/jobs").status_code == 401
    assert http.get("/dashboard/api/jobs").json()["error"]["type"] == "invalid_request_error"
    page = http.get("/dashboard/jobs")
    assert page.status_code == 401 and 'name="key"' in page.text
    refused = http.get("/dashboard/api/jobs", headers={"Authorization": "Bearer sk-barge-nope"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_logging_in_keeps_a_server_side_session_that_logout_ends(served):
    http = _app(served)
    assert http.post("/dashboard/login", data={"key": "sk-barge-wrong"}, headers=SAME_ORIGIN).status_code == 401
    answer = http.post("/dashboard/login", data={"key": served["alice"].secret}, headers=SAME_ORIGIN)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/dashboard" in cookie and "Secure" not in cookie   # plain http here; https adds Secure
    session_id = http.cookies[SESSION_COOKIE]
    assert served["alice"].secret not in cookie and session_id not in served["alice"].secret
    assert _listed(http) == {served["owned"]}
    assert http.get("/dashboard/schedules").status_code == 200   # a key sees no schedules: they are the operator's

    copied = _app(served)
    copied.cookies.set(SESSION_COOKIE, session_id)
    assert _listed(copied) == {served["owned"]}
    assert http.post("/dashboard/logout", headers=SAME_ORIGIN).status_code == 303
    assert copied.get("/dashboard/api/jobs").status_code == 401   # the copied cookie died with the logout

    ApiKeys(served["store"].engine).revoke(served["bob"].key.id)
    bobs = _app(served)
    assert bobs.post("/dashboard/login", data={"key": served["bob"].secret}, headers=SAME_ORIGIN).status_code == 401


def test_login_and_logout_refuse_another_origin(served):
    http = _app(served)
    for origin in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {}):
        answer = http.post("/dashboard/login", data={"key": served["alice"].secret}, headers=origin)
        assert answer.status_code == 403 and SESSION_COOKIE not in answer.headers.get("set-cookie", "")
    assert http.post("/dashboard/login", data={"key": served["alice"].secret},
                     headers={"Origin": "null", "Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert http.post("/dashboard/login", data={"key": served["alice"].secret},
                     headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"}).status_code == 303
    assert http.post("/dashboard/login", data={"key": served["alice"].secret},
                     headers={"Referer": "http://localhost/dashboard/login"}).status_code == 303
    assert http.post("/dashboard/logout", headers={"Origin": "http://evil.example"}).status_code == 403
    assert _listed(http) == {served["owned"]}   # still logged in


def test_a_revoked_key_ends_its_sessions(served):
    http = _app(served)
    assert http.post("/dashboard/login", data={"key": served["bob"].secret}, headers=SAME_ORIGIN).status_code == 303
    assert _listed(http) == set()
    ApiKeys(served["store"].engine).revoke(served["bob"].key.id)
    assert http.get("/dashboard/api/jobs").status_code == 401


def test_the_login_url_opens_an_operator_session_once(served):
    ticket = LoginTicket()
    http = _app(served, login_ticket=ticket)
    assert http.get("/dashboard/login", params={"ticket": "not-it"}).status_code == 401
    answer = http.get("/dashboard/login", params={"ticket": ticket.token})
    assert answer.status_code == 303 and SESSION_COOKIE in answer.headers["set-cookie"]
    assert _listed(http) == {served["owned"], served["unowned"]}
    assert "operator (login URL)" in http.get("/dashboard/jobs").text
    again = _app(served, login_ticket=ticket)
    assert again.get("/dashboard/login", params={"ticket": ticket.token}).status_code == 401   # spent
    assert again.get("/dashboard/api/jobs").status_code == 401
    assert _app(served).get("/dashboard/login", params={"ticket": ticket.token}).status_code == 401   # no ticket


def test_progress_rates_shards_and_chart_come_from_the_shards(served):
    store, job_id = served["store"], served["owned"]
    assert store.start_job(job_id, make_plans(3))
    for index in (0, 1):
        claim = store.claim_shard(job_id, index, worker_id="gpu-7:123", lease_s=60)
        store.commit_shard(job_id, index, claim.token, part=part(index), rows_succeeded=9, rows_failed=1,
                           num_tokens=500)
    store.claim_shard(job_id, 2, worker_id="gpu-7:123", lease_s=60)
    http = _app(served, operator=True)
    [listed] = [job for job in http.get("/dashboard/api/jobs").json()["jobs"] if job["id"] == job_id]
    assert (listed["rows_done"], listed["rows_failed"], listed["rows_total"]) == (20, 2, 30)
    assert listed["percent"] == pytest.approx(66.7) and listed["rows_per_s"] > 0 and listed["owner_name"] == "alice"
    found = http.get(f"/dashboard/api/jobs/{job_id}").json()
    assert found["shard_counts"] == {"pending": 0, "running": 1, "committed": 2, "failed": 0, "cancelled": 0}
    assert [s["worker"] for s in found["shards"]] == ["gpu-7:123"] * 3 and found["shards"][2]["attempt"] == 1
    assert sum(p["rows_per_s"] for p in found["points"]) * found["bucket_s"] == pytest.approx(20)
    assert sum(p["tokens_per_s"] for p in found["points"]) * found["bucket_s"] == pytest.approx(1000)
    page = http.get(f"/dashboard/jobs/{job_id}").text
    assert page.count('class="point"') == 2 * len(found["points"])
    filtered = http.get("/dashboard/api/jobs", params={"status": "queued"}).json()["jobs"]
    assert [job["id"] for job in filtered] == [served["unowned"]]
    assert http.get("/dashboard/api/jobs", params={"model": "no-such-model"}).json()["jobs"] == []


def test_the_job_page_shows_the_fp8_check_and_the_cost(served, monkeypatch):
    store, job_id = served["store"], served["owned"]
    store.record_quant_check(job_id, {"mode": "embed", "quantization": "fp8", "baseline_dtype": "float32",
                                      "num_rows": 8, "cosine_mean": 0.99991, "cosine_min": 0.99950})
    assert store.start_job(job_id, make_plans(1))
    claim = store.claim_shard(job_id, 0, worker_id="gpu-7:123", lease_s=60)
    store.commit_shard(job_id, 0, claim.token, part=part(0), rows_succeeded=10, rows_failed=0, num_tokens=1000,
                       engine={"model": "all-MiniLM-L6-v2", "device": "cpu"})
    monkeypatch.setenv("BARGE_PRICE_PER_HOUR", "3600")   # one unit per worker-second
    page = _app(served, operator=True).get(f"/dashboard/jobs/{job_id}").text
    assert "fp8 vs float32 on 8 rows of shard 0: embedding cosine mean 0.99991, min 0.99950" in page
    found = _app(served, operator=True).get(f"/dashboard/api/jobs/{job_id}").json()["report"]
    assert found["cost"]["price_per_hour"] == 3600 and found["cost"]["total"] >= 0
    assert "worker-hours at 3600" in page and "device=cpu" in page and "model=all-MiniLM-L6-v2" in page


def test_the_job_page_shows_a_generate_jobs_prefill_and_rows_per_adapter(served):
    """The lines `barge report` prints, adapter locations redacted as there."""
    store = served["store"]
    job_id = new_job(store, mode="generate")
    assert store.start_job(job_id, make_plans(1))
    claim = store.claim_shard(job_id, 0, worker_id="gpu-7:123", lease_s=60)
    usage = GenerateUsage(Prefill(num_prompt_tokens=9_000, num_cached_tokens=6_500, num_lower_bound=2_400),
                          (AdapterUsage(None, 4, 400), AdapterUsage("s3://AKIAADAPTER:adapter-secret@lora/support", 6, 600)))
    store.commit_shard(job_id, 0, claim.token, part=part(0), rows_succeeded=10, rows_failed=0, num_tokens=1000,
                       engine={"model": "smollm2", "device": "cpu"}, generate_usage=usage)
    page = html.unescape(_app(served, operator=True).get(f"/dashboard/jobs/{job_id}").text)
    assert "prefill: 2,500 prompt tokens computed, 6,500 from the prefix cache, lower bound 2,400 (1.04x)" in page
    assert re.search(r"adapters: base 4 rows 400 tokens; \S*lora/support 6 rows 600 tokens", page), page
    assert "adapter-secret" not in page and "AKIAADAPTER" not in page


def test_workers_show_their_heartbeat_engines_and_current_shards_to_whom_they_may(served):
    store, job_id = served["store"], served["owned"]
    assert store.start_job(job_id, make_plans(1))
    store.claim_shard(job_id, 0, worker_id="gpu-7:123", lease_s=60)
    engine = EngineBeat(settings={"model": "all-MiniLM-L6-v2", "mode": "embed", "device": "cpu"}, num_steps=42,
                        occupancy=0.75, kv_cache_usage=None, num_seqs=16)
    now = time.time()
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-7:123", models=["all-MiniLM-L6-v2"], engines=[engine],
                                              started_at=now - 60, heartbeat_at=now))
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-7:123", models=["all-MiniLM-L6-v2"], engines=[engine],
                                              started_at=now - 60, heartbeat_at=now + 1))   # an update, not a second row
    http = _app(served, operator=True)
    [worker] = http.get("/dashboard/api/workers").json()["workers"]
    assert worker["state"] == "alive" and worker["engines"][0]["num_steps"] == 42
    assert worker["shards"] == [{"job_id": job_id, "index": 0, "attempt": 1,
                                 "lease_expires_at": worker["shards"][0]["lease_expires_at"]}]
    assert "75%" in http.get("/dashboard/workers").text
    bob = {"Authorization": f"Bearer {served['bob'].secret}"}
    [seen_by_bob] = http.get("/dashboard/api/workers", headers=bob).json()["workers"]
    assert seen_by_bob["shards"] == []   # not his job


def test_a_worker_whose_engine_stalled_reads_stalled_with_the_reason(served):
    from dataclasses import replace

    from jobs.worker_beats import num_stalled
    store, now = served["store"], time.time()
    engine = EngineBeat(settings={"model": "all-MiniLM-L6-v2", "mode": "embed", "device": "cpu"}, num_steps=7)
    reason = "no engine step for 301 s (limit 300 s) in embed of 256 rows of job j1, busy for 301 s"
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-8:9", models=["all-MiniLM-L6-v2"],
                                              engines=[replace(engine, stall=reason)], started_at=now - 600,
                                              heartbeat_at=now, stopped_at=now))
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-8:10", models=["all-MiniLM-L6-v2"], engines=[engine],
                                              started_at=now, heartbeat_at=now))
    http = _app(served, operator=True)
    states = {w["id"]: w["state"] for w in http.get("/dashboard/api/workers").json()["workers"]}
    assert states == {"gpu-8:9": "stalled", "gpu-8:10": "alive"}
    assert "stalled: no engine step for 301 s" in http.get("/dashboard/workers").text
    assert num_stalled(store.engine) == 1   # the barge_engine_stalls metric


def test_no_page_shows_a_secret(served):
    store, job_id = served["store"], served["owned"]
    event_secret_url = SECRET_URL
    from jobs.outbox import OutboxEvent
    from jobs.status import JobStatus
    store.finish_job(job_id, JobStatus.FAILED, error=f"could not read s3://AKIAOWNED:owned-s3-secret@corpus/a",
                     event=OutboxEvent(id="msg_dash1", type="job.failed", url=event_secret_url, body=b"{}"))
    claimed = store.outbox.claim("msg_dash1")
    store.outbox.record("msg_dash1", claimed.attempts, ok=False, status_code=500,
                        error=f"HTTP 500 from {event_secret_url}", latency_s=0.01,
                        next_attempt_at=time.time() + 60)
    http = _app(served, operator=True)
    pages = [http.get(path).text for path in ("/dashboard/jobs", f"/dashboard/jobs/{job_id}",
                                             f"/dashboard/jobs/{job_id}?fragment=1", f"/dashboard/api/jobs/{job_id}",
                                             "/dashboard/api/jobs", "/dashboard/workers")]
    assert 'class="attempt failed"' in pages[1] and "HTTP 500" in pages[1]
    for text in pages:
        for secret in ("path-token-77", "query-token-88", "owned-s3-secret", "AKIAOWNED", "whsec_test"):
            assert secret not in text


def test_schedules_show_runs_with_rows_computed_and_reused_to_the_operator_only(served):
    store = served["store"]
    template = {"mode": "embed", "model": "minilm", "input": "/in/{date}/", "output": "/out/{date}/",
                "webhook_url": SECRET_URL}
    store.add_schedule("nightly", "0 2 * * *", "Europe/Paris", template, "latest", None, webhook_secret="whsec_sched")
    run = store.add_manual_run("nightly")
    job_id = store.create_job(make_spec(), model_key="all-MiniLM-L6-v2", rows_total=20, output_schema="{}",
                              webhook_secret=None, job_id=run.job_id)
    store.finish_run(run, "submitted")
    assert store.start_job(job_id, make_plans(2))
    for index, reused in ((0, 10), (1, 3)):
        claim = store.claim_shard(job_id, index, worker_id="w:1", lease_s=60)
        store.commit_shard(job_id, index, claim.token, part=part(index), rows_succeeded=10, rows_failed=0,
                           rows_reused=reused)
    http = _app(served, operator=True)
    page = http.get("/dashboard/schedules").text
    assert "nightly" in page and "0 2 * * *" in page and "Europe/Paris" in page
    row = page[page.index(job_id[:12]):]
    assert '<td class="num">7</td><td class="num">13</td>' in row   # computed 20 - 13 reused, reused 13
    for secret in ("path-token-77", "query-token-88", "whsec_sched"):
        assert secret not in page
    assert [job["id"] for job in http.get("/dashboard/api/jobs", params={"schedule": "nightly"}).json()["jobs"]] == [
        job_id]
    alice = {"Authorization": f"Bearer {served['alice'].secret}"}
    assert "nightly" not in http.get("/dashboard/schedules", headers=alice).text


class _Engine:
    """Stands in for a loaded Engine: its settings, and the step observers it calls."""

    settings = {"mode": "generate", "device": "cpu", "dtype": "float32", "max_num_seqs": 8}

    def __init__(self):
        self.observers = []

    def add_step_observer(self, observer) -> None:
        self.observers.append(observer)


def test_a_workers_heartbeat_reports_its_engines_steps_and_its_clean_stop(store):
    from types import SimpleNamespace

    from engine.step_stats import StepStats
    from queueing.heartbeat import Heartbeat
    from queueing.runtime import EngineKey
    engine = _Engine()
    runtime = SimpleNamespace(store=store, worker_id="host-a:42", models={"SmolLM2-135M-Instruct": None},
                              engines={EngineKey("SmolLM2-135M-Instruct", "generate"): engine})
    heartbeat = Heartbeat(runtime)
    heartbeat.beat()
    [observer] = engine.observers
    observer(StepStats(num_seqs=4, num_tokens=4, max_num_seqs=8, max_num_tokens=64, num_kv_blocks_used=3,
                       num_kv_blocks=12))
    heartbeat.stop()
    [beat] = WorkerBeats(store.engine).list()
    assert beat.id == "host-a:42" and beat.models == ["SmolLM2-135M-Instruct"] and beat.stopped_at is not None
    [reported] = beat.engines
    assert reported.settings["model"] == "SmolLM2-135M-Instruct" and reported.settings["device"] == "cpu"
    assert (reported.num_steps, reported.occupancy, reported.kv_cache_usage, reported.num_seqs) == (1, 0.5, 0.25, 4)


def test_the_job_page_stops_polling_once_nothing_can_change(served):
    from jobs.status import JobStatus
    from jobs.outbox import OutboxEvent
    store, http = served["store"], _app(served, operator=True)
    running, pending, quiet = served["owned"], served["unowned"], new_job(store)
    assert store.start_job(running, make_plans(1))
    store.finish_job(pending, JobStatus.FAILED, error="boom",
                     event=OutboxEvent(id="msg_dash2", type="job.failed", url=SECRET_URL, body=b"{}"))
    store.finish_job(quiet, JobStatus.FAILED, error="boom")
    settled = {job_id: "data-settled" in http.get(f"/dashboard/jobs/{job_id}?fragment=1").text
               for job_id in (running, pending, quiet)}
    assert settled == {running: False, pending: False, quiet: True}   # a pending webhook may still be retried


def test_the_jobs_list_pages_older_jobs_by_a_cursor_in_json_and_html(served):
    store, http = served["store"], _app(served, operator=True)
    for _ in range(MAX_JOBS):   # with the fixture's two: one page and two more
        new_job(store)
    first = http.get("/dashboard/api/jobs").json()
    assert len(first["jobs"]) == MAX_JOBS and first["next_before"] == first["jobs"][-1]["id"]
    rest = http.get("/dashboard/api/jobs", params={"before": first["next_before"]}).json()
    assert len(rest["jobs"]) == 2 and rest["next_before"] is None
    listed = [job["id"] for job in first["jobs"] + rest["jobs"]]
    assert len(set(listed)) == len(listed) == MAX_JOBS + 2 and listed[-1] == served["owned"]   # the oldest

    page = http.get("/dashboard/jobs").text
    older = re.search(r'<a id="older-jobs" href="([^"]+)"\s*>', page)
    assert older and html.unescape(older.group(1)) == f"/dashboard/jobs?before={first['next_before']}"
    last = http.get(html.unescape(older.group(1))).text
    assert re.search(r'<a id="older-jobs" [^>]*hidden>', last) and 'id="newest-jobs"' in last
    assert f"before={first['next_before']}" in last.split('data-poll="')[1].split('"')[0]   # refreshes its own page
    assert last.count("<tr data-job=") == 2

    queued = http.get("/dashboard/api/jobs", params={"status": "queued", "before": first["next_before"]}).json()
    assert [job["id"] for job in queued["jobs"]] == [job["id"] for job in rest["jobs"]]


def test_a_cursor_the_viewer_may_not_see_is_not_found(served):
    http = _app(served)
    alice = {"Authorization": f"Bearer {served['alice'].secret}"}
    for before in (served["unowned"], "0" * 32, "../etc"):
        answer = http.get("/dashboard/api/jobs", params={"before": before}, headers=alice)
        assert answer.status_code == 404 and answer.json()["error"]["message"] == "No job found with that id."
        assert http.get("/dashboard/jobs", params={"before": before}, headers=alice).status_code == 404
    assert http.get("/dashboard/api/jobs", params={"before": served["owned"]}, headers=alice).json() == {
        "jobs": [], "next_before": None}
