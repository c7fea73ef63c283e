"""The jobs list's paging in a real headless Chromium, against the real app under uvicorn
on a SQLite store: given one job more than a page, when the operator opens the list, then
"Older jobs" points after the page's last job; when a job is submitted, the 2-second
refresh puts it first and moves that link on by one (the job pushed off the first page is
on the next, not skipped); the older page has the rest and no further link.

The whole dashboard against a worker and `barge serve` is tests/e2e/test_dashboard_e2e.py."""

from __future__ import annotations

import threading

import pytest

from api.dashboard.reads import MAX_JOBS
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.settings import Settings
from tests.integration.test_store import new_job
from tests.support.browser import has_chromium, headless_chromium, wait_for
from tests.support.stack import free_port

pytestmark = pytest.mark.skipif(not has_chromium(), reason="needs chromium and chromium-driver (Debian packages)")
pytest.importorskip("selenium")
from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture
def served(tmp_path):
    import uvicorn

    from api.app import create_app
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path)}))
    operator = ApiKeys(client.store.engine).create("ops", operator=True).secret
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(client), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    yield client.store, f"http://localhost:{port}", operator
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


def _older_before(browser) -> str | None:
    """The cursor of the "Older jobs" link, or None while it is hidden."""
    return browser.execute_script("const link = document.getElementById('older-jobs');"
                                  "return link.hidden ? null : new URL(link.href).searchParams.get('before');")


def _listed(browser) -> list[str]:
    return browser.execute_script("return [...document.querySelectorAll('#jobs-body tr[data-job]')]"
                                  ".map((row) => row.dataset.job);")


def test_older_jobs_follows_the_refreshed_first_page(served, browser):
    store, base, operator = served
    job_ids = [new_job(store) for _ in range(MAX_JOBS + 1)][::-1]   # newest first
    browser.get(base + "/dashboard/login")
    browser.find_element(By.NAME, "key").send_keys(operator)
    browser.find_element(By.CSS_SELECTOR, "form.login button").click()
    wait_for(lambda: browser.current_url.endswith("/dashboard/jobs"), 10, "the jobs list after logging in")
    assert _listed(browser) == job_ids[:MAX_JOBS] and _older_before(browser) == job_ids[MAX_JOBS - 1]

    newest = new_job(store)
    wait_for(lambda: _listed(browser)[:1] == [newest], 10, "the refresh to list the new job")
    assert _older_before(browser) == job_ids[MAX_JOBS - 2]

    browser.find_element(By.ID, "older-jobs").click()
    wait_for(lambda: "before=" in browser.current_url, 10, "the older page")
    assert _listed(browser) == job_ids[MAX_JOBS - 1:] and _older_before(browser) is None
    polled = int(browser.find_element(By.ID, "jobs-body").get_attribute("data-polled") or 0)
    wait_for(lambda: int(browser.find_element(By.ID, "jobs-body").get_attribute("data-polled") or 0) > polled, 10,
             "the older page's own refresh")
    assert _listed(browser) == job_ids[MAX_JOBS - 1:] and browser.find_element(By.ID, "newest-jobs")
