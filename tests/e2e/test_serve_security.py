"""`barge serve` probed as an attacker on the same machine would (issue 40), against a real
server on the embedded default, a same-host forwarding proxy in front of it, and an OpenAI
batch of alice's whose metadata holds a webhook URL with a token in its path, another URL
of that kind, an API key and an AWS secret. No worker runs: the batch's job stays queued.

Each probe is what main at d9a7a84 failed: a keyless 24 MB body parsed before its 401
(peak memory +655 MB); the operator's view for any keyless caller from 127.0.0.1, hence for
everyone behind a same-host proxy; any Host header answered (DNS rebinding); secrets shown;
a line nested 100,000 deep answered 500 and a U+2028 inside a string refused; a key in a
query string in the access log; a login accepted from another origin.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.forwarding_proxy import ForwardingProxy
from tests.support.lazy_import import importorskip_lazily
from tests.support.stack import free_port, stack

openai = importorskip_lazily("openai")

SECRETS = {"webhook path": "WEBHOOK-PATH-SECRET-5e1", "notify path": "NOTIFY-PATH-SECRET-7c2",
           "metadata api_key": "META-API-KEY-SECRET-9d3", "metadata aws": "META-AWS-SECRET-1a4"}
METADATA = {"webhook_url": f"http://127.0.0.1:9/services/T0/B0/{SECRETS['webhook path']}",
            "notify": f"https://hooks.example.com/services/T1/B1/{SECRETS['notify path']}",
            "api_key": SECRETS["metadata api_key"], "aws_secret_access_key": SECRETS["metadata aws"]}
BIG_BODY = 24 << 20            # the 24 MB keyless body
PEAK_RISE_LIMIT = 8 << 20      # "a few MB"; main at d9a7a84 rose 655 MB (bench/keyless_body_bench.py)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-security")
    with stack("embedded", root / "barge") as deployment:
        port = free_port()
        server = deployment.spawn([sys.executable, "-m", "cli", "serve", "--port", str(port)], "serve.log")
        deployment.workers.append(server)   # stopped with the deployment (SIGTERM)
        deployment.port, deployment.server = port, server
        deployment.base = f"http://127.0.0.1:{port}"
        deployment.alice = deployment.create_api_key("alice")
        deployment.operator = deployment.create_api_key("ops", operator=True)
        deployment.login_url = deployment.login_url(server)
        _wait_serving(deployment)
        alice = openai.OpenAI(base_url=deployment.base + "/v1", api_key=deployment.alice, max_retries=0)
        lines = [{"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "minilm", "input": f"barge {i}"}} for i in range(2)]
        uploaded = alice.files.create(file=("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
                                      purpose="batch")
        batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                     metadata=METADATA)
        assert batch.status != "failed", batch.errors
        deployment.batch = batch
        deployment.job_id = _operator_json(deployment, "/dashboard/api/jobs")["jobs"][0]["id"]
        yield deployment


def _wait_serving(deployment, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and deployment.server.poll() is None:
        try:
            urllib.request.urlopen(deployment.base + "/dashboard/login", timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"barge serve did not start:\n{Path(deployment.server.log_path).read_text()[-3000:]}")


def _operator_json(deployment, path: str) -> dict:
    request = urllib.request.Request(deployment.base + path, headers={"Authorization": f"Bearer {deployment.operator}"})
    return json.load(urllib.request.urlopen(request, timeout=10))


def _request(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"",
             host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on a fresh socket, exactly as written (Host included)."""
    head = {"Host": f"127.0.0.1:{port}" if host is None else host, "Content-Length": str(len(body)), "Connection": "close",
            **(headers or {})}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\n".encode() + b"".join(
            f"{name}: {value}\r\n".encode() for name, value in head.items()) + b"\r\n" + body)
        answer = _read_all(sock)
    return _parse(answer)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _answer_before_the_body(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict, bytes]:
    """Declare a 24 MB body, send none of it, and wait for the answer: a server that reads
    the body before it checks the key never answers (the read times out)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = {"Host": f"127.0.0.1:{port}", "Content-Length": str(BIG_BODY), **headers}
        sock.sendall(f"POST {path} HTTP/1.1\r\n".encode() + b"".join(
            f"{name}: {value}\r\n".encode() for name, value in head.items()) + b"\r\n")
        return _parse(_read_all(sock))


def _send_whole(port: int, path: str, headers: dict[str, str]) -> int | None:
    """The whole 24 MB keyless body, as fast as the server takes it; its status, if answered."""
    pad = b"{}," * ((BIG_BODY - 100) // 3)   # a Python object per 3 bytes, were it parsed: d9a7a84 rose 655 MB
    body = b'{"input_file_id": "x", "endpoint": "e", "completion_window": "24h", "pad": [' + pad + b'{}]}'
    head = {"Host": f"127.0.0.1:{port}", "Content-Length": str(len(body)), **headers}
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\n".encode() + b"".join(
                f"{name}: {value}\r\n".encode() for name, value in head.items()) + b"\r\n" + body)
        except OSError:   # the server answered and closed before taking it all
            pass
        try:
            return _parse(_read_all(sock))[0]
        except (OSError, IndexError, ValueError):
            return None


def test_a_keyless_24_mb_body_is_answered_401_before_it_is_sent_and_costs_no_memory(served):
    for _ in range(3):   # the server's own steady state first: its peak after ordinary requests
        _request(served.port, "GET", "/v1/batches", {"Authorization": f"Bearer {served.alice}"})
    before = _peak_rss(served.server.pid)
    probes = [("/v1/batches", {"Content-Type": "application/json"}),
              ("/v1/batches", {"Content-Type": "application/json", "Authorization": "Bearer sk-barge-wrong"}),
              ("/v1/files", {"Content-Type": "multipart/form-data; boundary=xyz"}),
              ("/openapi.json", {})]
    for path, headers in probes:
        status, answer_headers, body = _answer_before_the_body(served.port, path, headers)
        assert status == 401, (path, status, body)
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        assert answer_headers.get("connection") == "close"
    for path, headers in probes[:3]:
        assert _send_whole(served.port, path, headers) in (401, None)
    rise = _peak_rss(served.server.pid) - before
    assert rise <= PEAK_RISE_LIMIT, f"peak memory rose {rise / 2**20:.1f} MB for keyless bodies"


def test_keyless_callers_see_no_job_directly_or_behind_a_same_host_proxy(served):
    with ForwardingProxy(served.port) as proxy:
        # nginx's bare proxy_pass sends the upstream's own name as Host: an allowed one
        for port, host in ((served.port, None), (proxy.port, f"127.0.0.1:{served.port}"),
                           (proxy.port, f"localhost:{served.port}")):
            for path in ("/dashboard/api/jobs", "/dashboard/api/workers", f"/dashboard/api/jobs/{served.job_id}",
                         "/v1/batches", f"/v1/batches/{served.batch.id}", "/openapi.json"):
                status, _, body = _request(port, "GET", path, host=host)
                assert status == 401 and served.job_id.encode() not in body, (port, path, status)
            for path in ("/dashboard/jobs", f"/dashboard/jobs/{served.job_id}", "/dashboard/workers",
                         "/dashboard/schedules"):
                status, _, body = _request(port, "GET", path, host=host)
                assert status == 401 and b'name="key"' in body and served.job_id.encode() not in body
        assert proxy.connections == 20   # every probe above went through it
    assert served.job_id in {job["id"] for job in _operator_json(served, "/dashboard/api/jobs")["jobs"]}


def test_a_foreign_host_is_answered_400_whoever_asks(served):
    for host in ("evil.example", f"evil.example:{served.port}", "127.0.0.1.nip.io", "[::2]:80", ""):
        status, _, body = _request(served.port, "GET", "/dashboard/api/jobs", host=host,
                                   headers={"Authorization": f"Bearer {served.operator}"})
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_host", host
        assert served.job_id.encode() not in body
    for host in (f"localhost:{served.port}", f"127.0.0.1:{served.port}", "LOCALHOST"):
        assert _request(served.port, "GET", "/dashboard/api/jobs", host=host,
                        headers={"Authorization": f"Bearer {served.operator}"})[0] == 200


def test_no_secret_in_the_dashboard_or_the_api_answers(served):
    outputs = {"jobs json": json.dumps(_operator_json(served, "/dashboard/api/jobs")),
               "job json": json.dumps(_operator_json(served, f"/dashboard/api/jobs/{served.job_id}"))}
    operator = {"Authorization": f"Bearer {served.operator}"}
    for path in ("/dashboard/jobs", f"/dashboard/jobs/{served.job_id}", f"/dashboard/jobs/{served.job_id}?fragment=1"):
        status, _, body = _request(served.port, "GET", path, operator)
        assert status == 200
        outputs[path] = body.decode()
    for name, text in outputs.items():
        for what, secret in SECRETS.items():
            assert secret not in text, f"{what} shown in {name}"
    assert "hooks.example.com" in outputs[f"/dashboard/jobs/{served.job_id}"]   # where, without the token


def test_no_secret_in_the_cli(served):
    """After the batch is cancelled its job's final webhook is queued (to a port nobody
    answers): `webhooks list/show` have an event to show, with its URL."""
    alice = openai.OpenAI(base_url=served.base + "/v1", api_key=served.alice, max_retries=0)
    alice.batches.cancel(served.batch.id)
    env = {**served.env}
    shown = []
    for argv in (["status", served.job_id], ["webhooks", "list"]):
        done = subprocess.run([sys.executable, "-m", "cli", *argv], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        shown.append(done.stdout + done.stderr)
    events = re.findall(r"msg_[0-9a-f]{32}", shown[1])
    assert events, shown[1]
    for event in events[:3]:
        done = subprocess.run([sys.executable, "-m", "cli", "webhooks", "show", event],
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "hooks.example.com" in done.stdout, done.stdout + done.stderr
        shown.append(done.stdout + done.stderr)
    for text in shown:
        for what, secret in SECRETS.items():
            assert secret not in text, f"{what} shown by the CLI:\n{text}"


def test_a_key_in_a_query_string_is_refused_and_in_no_log(served):
    status, _, _ = _request(served.port, "GET", f"/v1/batches?api_key={served.alice}")
    assert status == 401
    status, _, _ = _request(served.port, "GET", f"/v1/batches?limit=2&after=QUERY-IN-LOG-{served.alice[-6:]}",
                            {"Authorization": f"Bearer {served.alice}"})
    assert status in (200, 404)
    time.sleep(0.5)   # the access log line is written after the answer
    log = Path(served.server.log_path).read_text()
    assert "GET /v1/batches HTTP/1.1" in log   # the access log is kept, without its query
    assert served.alice not in log and "QUERY-IN-LOG" not in log and "api_key=" not in log


def test_the_dashboard_login_is_a_server_side_session_from_its_own_origin_only(served):
    form = f"key={served.alice}".encode()
    form_headers = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = _request(served.port, "POST", "/dashboard/login", {**form_headers,
                                  "Origin": "http://evil.example"}, form)
    assert status == 403 and "set-cookie" not in headers
    status, headers, _ = _request(served.port, "POST", "/dashboard/login", {**form_headers,
                                  "Origin": f"http://127.0.0.1:{served.port}"}, form)
    assert status == 303
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and served.alice not in cookie
    session = cookie.split(";")[0]
    assert _request(served.port, "GET", "/dashboard/api/jobs", {"Cookie": session})[0] == 200
    status, _, _ = _request(served.port, "POST", "/dashboard/logout", {"Cookie": session,
                                                                        "Origin": f"http://127.0.0.1:{served.port}"})
    assert status == 303
    assert _request(served.port, "GET", "/dashboard/api/jobs", {"Cookie": session})[0] == 401
    big = b"key=" + b"x" * (64 << 10)
    assert _request(served.port, "POST", "/dashboard/login", {**form_headers,
                    "Origin": f"http://127.0.0.1:{served.port}"}, big)[0] == 413


def test_the_printed_login_url_opens_the_operators_view_once(served):
    path = served.login_url.split(str(served.port), 1)[1]
    status, headers, _ = _request(served.port, "GET", path)
    assert status == 303 and headers["location"].endswith("/dashboard/jobs")
    session = headers["set-cookie"].split(";")[0]
    status, _, body = _request(served.port, "GET", "/dashboard/api/jobs", {"Cookie": session})
    assert status == 200 and served.job_id in {job["id"] for job in json.loads(body)["jobs"]}
    assert _request(served.port, "GET", path)[0] == 401   # spent
    log = Path(served.server.log_path).read_text()
    assert log.count(path.split("ticket=")[1]) == 1      # printed once at start, never in the access log


def test_unknown_routes_and_methods_answer_in_openais_shape(served):
    alice = {"Authorization": f"Bearer {served.alice}"}
    for method, path, expected in (("GET", "/v1/nothing", 404), ("DELETE", "/v1/batches", 405),
                                   ("GET", f"/v1/batches/{'x' * 5000}", 404)):
        status, _, body = _request(served.port, method, path, alice)
        assert status == expected
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and len(error["message"]) < 300


def test_deep_nesting_and_u2028_behave_as_jsonl_says(served):
    alice = openai.OpenAI(base_url=served.base + "/v1", api_key=served.alice, max_retries=0)
    good = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "minilm", "input": "one\u2028two\x0cthree"}}
    deep = '{"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": ' + "[" * 100_000 + "]" * 100_000 + "}"
    data = (json.dumps(good, ensure_ascii=False) + "\n" + deep + "\n").encode()
    uploaded = alice.files.create(file=("deep.jsonl", data), purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", 2)]

    uploaded = alice.files.create(file=("u2028.jsonl", (json.dumps(good, ensure_ascii=False) + "\r\n").encode()),
                                  purpose="batch")
    batch = alice.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert batch.status != "failed", batch.errors
