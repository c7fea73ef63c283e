"""The dashboard in a real headless Chromium, against `barge serve`, a worker process and
the embedded store: a generate job with a null row and a webhook receiver that answers
500 at first, and an OpenAI batch made with alice's key.

Given the operator logged in by the one-time URL `barge serve` printed (nobody gets the
operator's view by address), when the browser opens the jobs list while the job runs, then the job appears and its progress
bar moves without a reload; its page draws chart points, lists the failed row from
errors.jsonl and the failed webhook attempt, and never shows a secret. Given alice's and
bob's keys, bob sees neither alice's job in the list nor its page. Every page's
screenshot has more than a handful of colours."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.browser import distinct_colours, has_chromium, headless_chromium, wait_for
from tests.support.flaky_receiver import FlakyReceiver, Mode
from tests.support.stack import free_port, stack, wait_ready

pytestmark = pytest.mark.skipif(not has_chromium(), reason="needs chromium and chromium-driver (Debian packages)")
pytest.importorskip("selenium")
from selenium.webdriver.common.by import By  # noqa: E402

from jobs import JobSpec, JobStatus  # noqa: E402

NUM_ROWS, ROWS_PER_SHARD, NULL_ROW = 32, 2, 5
URL_TOKEN = "tok-3f9a1c-never-shown"
MIN_COLOURS = 16   # a blank or single-colour page has 1 or 2


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("dashboard")
    env = {"BARGE_API_ROWS_PER_SHARD": "1", "BARGE_WEBHOOK_RETRY_BASE_S": "1"}
    with stack("embedded", root / "barge", env=env) as deployment:
        deployment.root = root
        worker = deployment.spawn([sys.executable, "-m", "cli", "worker", "--model", "smollm2"], "worker.log")
        deployment.workers.append(worker)
        port = free_port()
        server = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve.log")
        deployment.workers.append(server)
        deployment.base = f"http://127.0.0.1:{port}"
        deployment.keys = {name: deployment.create_api_key(name) for name in ("alice", "bob")}
        deployment.keys["operator"] = deployment.create_api_key("ops", operator=True)
        deployment.login_url = deployment.login_url(server)
        wait_ready(worker)
        wait_for(lambda: _is_serving(deployment.base), 60, "barge serve to answer")
        yield deployment


@pytest.fixture(scope="module")
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = os.environ.get("BARGE_DASHBOARD_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screens")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _is_serving(base: str) -> bool:
    try:
        urllib.request.urlopen(base + "/dashboard/login", timeout=2)
        return True
    except OSError:
        return False


def _corpus(folder: Path) -> str:
    folder.mkdir(parents=True)
    texts = [None if i == NULL_ROW else f"Write one sentence about barge number {i}." for i in range(NUM_ROWS)]
    pq.write_table(pa.table({"doc_id": pa.array(range(NUM_ROWS), pa.int64()), "text": pa.array(texts, pa.string())}),
                   folder / "part-0.parquet", row_group_size=ROWS_PER_SHARD)
    return str(folder)


def _shot(browser, screenshots: Path, name: str) -> int:
    png = browser.get_screenshot_as_png()
    (screenshots / f"{name}.png").write_bytes(png)
    return distinct_colours(browser, png)


def _job_row_progress(browser, job_id: str) -> float | None:
    """Read in one script: the poll rebuilds the table's rows under a WebDriver element."""
    return browser.execute_script("const bar = document.querySelector(`tr[data-job='${arguments[0]}'] progress`);"
                                  "return bar ? bar.value : null;", job_id)


def _as_operator(deployment, path: str) -> dict:
    request = urllib.request.Request(deployment.base + path,
                                     headers={"Authorization": f"Bearer {deployment.keys['operator']}"})
    return json.load(urllib.request.urlopen(request))


def _held_shards(deployment) -> set[str]:
    workers = _as_operator(deployment, "/dashboard/api/workers")["workers"]
    return {shard["job_id"] for worker in workers for shard in worker["shards"]}


def test_operator_watches_a_job_run(deployment, browser, screenshots):
    client = deployment.client()
    with FlakyReceiver() as receiver:
        receiver.set_mode(Mode.ERRORS)   # every delivery fails until the page has shown one
        spec = JobSpec(mode="generate", model="smollm2", input=_corpus(deployment.root / "corpus"),
                       id_column="doc_id", output=str(deployment.root / "out"),
                       webhook_url=f"{receiver.url}?token={URL_TOKEN}", max_rows_per_shard=ROWS_PER_SHARD,
                       params={"max_tokens": 24, "temperature": 0})
        # Given the jobs list open in the browser, when the job is submitted and runs, then
        # its row appears and its progress bar moves, with no reload (the page's marker stays).
        browser.get(deployment.login_url)   # lands on the jobs list, an operator session in its cookie
        assert browser.current_url.endswith("/dashboard/jobs") and "?" not in browser.current_url
        browser.execute_script("window.barge_marker = 'not reloaded';")
        job = client.submit(spec)
        wait_for(lambda: _job_row_progress(browser, job.id) is not None, 60, "the job's row")
        seen, held = set(), set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            seen.add(_job_row_progress(browser, job.id))
            held |= _held_shards(deployment)
            if 100.0 in seen:
                break
            time.sleep(0.3)
        assert len(seen) >= 2 and 100.0 in seen, f"progress values seen: {sorted(seen)}"
        assert job.id in held, "the workers page named a shard of the job while the worker held it"
        assert browser.execute_script("return window.barge_marker;") == "not reloaded"
        assert _shot(browser, screenshots, "jobs") >= MIN_COLOURS

        # The job page: chart points, the failed row, a failed webhook attempt, no secret.
        browser.get(f"{deployment.base}/dashboard/jobs/{job.id}")
        assert job.wait(timeout=300).status == JobStatus.SUCCEEDED
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.attempt.failed"), 60,
                 "a failed webhook attempt on the job page")
        receiver.set_mode(Mode.OK)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.attempt.ok"), 60, "the delivered attempt")
        points = browser.find_elements(By.CSS_SELECTOR, "svg circle.point")
        committed = browser.find_elements(By.CSS_SELECTOR, "svg polyline.line")
        assert len(points) >= 4 and len(committed) == 2, "points in both charts (8 shards over seconds: several buckets)"
        failed = browser.find_element(By.ID, "failed-rows").text
        assert str(NULL_ROW) in failed and "null" in failed.lower()
        assert "500" in browser.find_element(By.CSS_SELECTOR, "tr.attempt.failed").text
        page = browser.page_source
        assert URL_TOKEN not in page and job.webhook_secret not in page
        assert browser.find_element(By.ID, "job-status").text == "succeeded"
        browser.set_window_size(1200, 1800)   # the whole page in one picture (docs/dashboard.md shows it)
        assert _shot(browser, screenshots, "job") >= MIN_COLOURS
        browser.set_window_size(1280, 1000)

    # The workers page: the worker's heartbeat, its model and its engine's step figures.
    browser.get(deployment.base + "/dashboard/workers")
    worker_row = browser.find_element(By.CSS_SELECTOR, "tr[data-worker]").text
    assert "alive" in worker_row and "steps" in worker_row and "occupancy" in worker_row
    assert _shot(browser, screenshots, "workers") >= MIN_COLOURS


def test_schedules_page(deployment, browser, screenshots):
    client = deployment.client()
    client.schedules.add("nightly-barges", cron="0 2 * * *", template={
        "mode": "generate", "model": "smollm2", "input": str(deployment.root / "corpus"),
        "output": str(deployment.root / "nightly/{date}"), "params": {"max_tokens": 4}})
    browser.get(deployment.base + "/dashboard/schedules")
    text = browser.find_element(By.TAG_NAME, "main").text
    assert "nightly-barges" in text and "0 2 * * *" in text
    assert _shot(browser, screenshots, "schedules") >= MIN_COLOURS


def _batch_job_id(deployment, batch_id: str) -> str:
    from sqlalchemy import select

    from jobs.api_tables import api_batches
    with deployment.client().store.engine.connect() as conn:
        return conn.execute(select(api_batches.c.job_id).where(api_batches.c.id == batch_id)).scalar_one()


def _log_in(browser, deployment, key: str) -> None:
    browser.delete_all_cookies()
    browser.get(deployment.base + "/dashboard/login")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "login").click()
    wait_for(lambda: browser.current_url.endswith("/dashboard/jobs"), 30, "the jobs list after logging in")


def test_a_key_sees_only_its_own_jobs(deployment, browser, screenshots):
    openai = pytest.importorskip("openai")
    alice = openai.OpenAI(base_url=deployment.base + "/v1", api_key=deployment.keys["alice"], max_retries=0)
    lines = [{"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "smollm2", "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 8}}
             for i in range(2)]
    uploaded = alice.files.create(file=("b.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                  purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    job_id = _batch_job_id(deployment, batch.id)
    operator_jobs = {row["id"] for row in _as_operator(deployment, "/dashboard/api/jobs")["jobs"]}
    assert job_id in operator_jobs   # an operator key sees every job
    with pytest.raises(urllib.error.HTTPError) as keyless:   # loopback without a key sees none
        urllib.request.urlopen(deployment.base + "/dashboard/api/jobs")
    assert keyless.value.code == 401

    _log_in(browser, deployment, deployment.keys["alice"])
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job_id}"]'), 30, "alice's job")
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-job]")) == 1, "only her own job"
    assert "alice" in browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"]').text

    _log_in(browser, deployment, deployment.keys["bob"])
    time.sleep(2.5)   # a poll of the JSON endpoint has come and gone
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-job]")
    browser.get(f"{deployment.base}/dashboard/jobs/{job_id}")
    assert browser.find_element(By.ID, "missing").is_displayed()
    request = urllib.request.Request(f"{deployment.base}/dashboard/api/jobs/{job_id}",
                                     headers={"Authorization": f"Bearer {deployment.keys['bob']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 404

    browser.delete_all_cookies()
    browser.get(deployment.base + "/dashboard/login")
    assert _shot(browser, screenshots, "login") >= MIN_COLOURS


def test_the_non_blank_check_can_fail(browser):
    """The colour count the page checks rely on: a blank page has one colour."""
    browser.get("about:blank")
    assert distinct_colours(browser, browser.get_screenshot_as_png()) < MIN_COLOURS
