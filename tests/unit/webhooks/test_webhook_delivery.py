import json
import socket

import pytest

from tests.support.receiver import WebhookReceiver
from webhooks.deliver import DeliveryResult, parse_retry_after, retry_delay, send
from webhooks.events import job_event
from webhooks.safety import ALLOW_HOSTS_ENV
from webhooks.signing import generate_secret, verify

LOCAL = ("127.0.0.1",)


@pytest.fixture(autouse=True)
def no_env_allow_list(monkeypatch):
    monkeypatch.delenv(ALLOW_HOSTS_ENV, raising=False)


@pytest.fixture
def event():
    return job_event(
        "job.succeeded", job_id="job_7", status="succeeded", rows_total=3, rows_succeeded=3,
        rows_failed=0, output="/tmp/out/", manifest_url=None, error=None, metadata=None, timings=None,
    )


@pytest.fixture
def secret():
    return generate_secret()


# --- retry_delay: a pure table -------------------------------------------------------


@pytest.mark.parametrize(
    "attempt, expected_ceiling",
    [(1, 5.0), (2, 10.0), (3, 20.0), (4, 40.0), (10, 2560.0), (13, 20480.0), (14, 21600.0), (50, 21600.0),
     (10_000, 21600.0)],
)
def test_retry_delay_grows_then_caps(attempt, expected_ceiling):
    assert retry_delay(attempt, rng=lambda: 1.0) == expected_ceiling
    assert retry_delay(attempt, rng=lambda: 0.5) == expected_ceiling / 2
    assert retry_delay(attempt, rng=lambda: 0.0) == 0.0


def test_retry_delay_custom_base_and_cap():
    assert retry_delay(3, base_s=1.0, cap_s=3.0, rng=lambda: 1.0) == 3.0
    assert retry_delay(2, base_s=1.0, cap_s=3.0, rng=lambda: 1.0) == 2.0


@pytest.mark.parametrize(
    "retry_after_s, expected", [(7.0, 7.0), (0.0, 0.0), (-3.0, 0.0), (99_999.0, 21600.0)]
)
def test_retry_delay_honours_retry_after_within_cap(retry_after_s, expected):
    assert retry_delay(1, retry_after_s=retry_after_s, rng=lambda: 0.0) == expected


def test_retry_delay_jitter_stays_in_range():
    delays = [retry_delay(3) for _ in range(200)]
    assert all(0.0 <= delay < 20.0 for delay in delays)
    assert len(set(delays)) > 1


def test_retry_delay_rejects_attempt_zero():
    with pytest.raises(ValueError, match="attempt"):
        retry_delay(0)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0),  # 100 s since the epoch, now = 60
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=60.0) == expected


# --- send: real HTTP to a local receiver -----------------------------------------------


def test_send_200_delivers_signed_body(event, secret):
    with WebhookReceiver() as receiver:
        result = send(receiver.url, event, secret, allow_hosts=LOCAL)
        [(headers, body)] = receiver.wait_for(1)
    assert result.ok and result.status_code == 200
    assert result.error is None and not result.is_permanent and result.retry_after_s is None
    assert result.latency_s > 0
    assert body == event.body()
    assert headers["webhook-id"] == event.event_id
    assert headers["content-type"] == "application/json"
    assert verify(secret, headers, body)["data"]["job_id"] == "job_7"


def test_send_signs_with_given_timestamp(event, secret):
    with WebhookReceiver() as receiver:
        send(receiver.url, event, secret, allow_hosts=LOCAL, now=1_700_000_000)
        [(headers, body)] = receiver.wait_for(1)
    assert headers["webhook-timestamp"] == "1700000000"
    assert verify(secret, headers, body, now=1_700_000_000)


def test_send_500_is_retryable_and_retry_resends_same_bytes(event, secret):
    with WebhookReceiver(responses=[500, 200]) as receiver:
        first = send(receiver.url, event, secret, allow_hosts=LOCAL)
        second = send(receiver.url, event, secret, allow_hosts=LOCAL)
        requests = receiver.wait_for(2)
    assert (first.ok, first.status_code, first.is_permanent) == (False, 500, False)
    assert "500" in first.error and secret not in first.error
    assert second.ok
    assert requests[0][1] == requests[1][1]
    assert requests[0][0]["webhook-id"] == requests[1][0]["webhook-id"]


def test_send_410_is_permanent(event, secret):
    with WebhookReceiver(responses=[410]) as receiver:
        result = send(receiver.url, event, secret, allow_hosts=LOCAL)
    assert (result.ok, result.status_code, result.is_permanent) == (False, 410, True)


def test_send_429_reports_retry_after(event, secret):
    with WebhookReceiver(responses=[(429, {"Retry-After": "7"})]) as receiver:
        result = send(receiver.url, event, secret, allow_hosts=LOCAL)
    assert (result.ok, result.status_code, result.is_permanent) == (False, 429, False)
    assert result.retry_after_s == 7.0
    assert retry_delay(1, retry_after_s=result.retry_after_s) == 7.0


def test_send_does_not_follow_redirects(event, secret):
    with WebhookReceiver() as target, WebhookReceiver(responses=[(302, {"Location": target.url})]) as receiver:
        result = send(receiver.url, event, secret, allow_hosts=LOCAL)
        assert target.requests == []
    assert (result.ok, result.status_code) == (False, 302)
    assert "redirect" in result.error


def test_send_connection_refused_returns_error(event, secret):
    with socket.socket() as sock:  # a port that was free a moment ago and has no listener
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = send(f"http://127.0.0.1:{port}/hook", event, secret, allow_hosts=LOCAL, timeout_s=2)
    assert isinstance(result, DeliveryResult)
    assert not result.ok and result.status_code is None and not result.is_permanent
    assert "refused" in result.error.lower()
    assert secret not in result.error and secret.removeprefix("whsec_") not in result.error


def test_send_read_timeout_returns_error(event, secret):
    with socket.socket() as server:  # accepts connections but never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
        result = send(url, event, secret, allow_hosts=LOCAL, timeout_s=0.3)
    assert not result.ok and result.status_code is None and not result.is_permanent
    assert "timed out" in result.error.lower()


def test_send_refuses_unsafe_destination_without_sending(event, secret):
    with WebhookReceiver() as receiver:
        result = send(receiver.url, event, secret)  # 127.0.0.1 not allow-listed
        assert receiver.requests == []
    assert not result.ok and result.is_permanent and result.status_code is None
    assert "unsafe destination" in result.error


def test_send_allow_list_from_env(event, secret, monkeypatch):
    monkeypatch.setenv(ALLOW_HOSTS_ENV, "127.0.0.1")
    with WebhookReceiver() as receiver:
        assert send(receiver.url, event, secret).ok


def test_send_unusable_secret_is_permanent_and_not_echoed(event):
    bad_secret = "whsec_not*base64!"
    with WebhookReceiver() as receiver:
        result = send(receiver.url, event, bad_secret, allow_hosts=LOCAL)
        assert receiver.requests == []
    assert not result.ok and result.is_permanent
    assert "not*base64" not in result.error


def test_send_unresolvable_host_is_retryable(event, secret, monkeypatch):
    # Stub the resolver so the test does not depend on how this machine's DNS fails.
    def no_such_host(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    result = send("http://no-such-host.invalid/hook", event, secret, timeout_s=2)
    assert not result.ok and not result.is_permanent and result.status_code is None
    assert result.error.startswith("cannot resolve host")


def test_receiver_records_json_body(event, secret):
    with WebhookReceiver() as receiver:
        send(receiver.url, event, secret, allow_hosts=LOCAL)
        [(_, body)] = receiver.wait_for(1, timeout_s=5)
        assert receiver.paths == ["/hook"]
    assert json.loads(body)["type"] == "job.succeeded"


# --- DNS rebinding: the connection goes to the address that was checked ---------------


@pytest.fixture
def rebinding_dns(monkeypatch):
    """webhook.test resolves to 127.0.0.1 once, then to an unroutable private address."""
    real_getaddrinfo = socket.getaddrinfo
    lookups = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "webhook.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "10.255.255.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def test_send_connects_to_the_checked_address(event, secret, rebinding_dns):
    # Given a host allow-listed by its address only, whose DNS answer changes after the check
    with WebhookReceiver() as receiver:
        url = f"http://webhook.test:{receiver.port}/hook"
        # When sending
        result = send(url, event, secret, allow_hosts=LOCAL, timeout_s=2)
        [(headers, body)] = receiver.wait_for(1)
    # Then the request reached the address that passed the check, named by its host
    assert result.ok, result.error
    assert rebinding_dns == ["webhook.test"]
    assert headers["host"] == f"webhook.test:{receiver.port}"
    assert verify(secret, headers, body)


def test_send_https_is_pinned_too(event, secret, rebinding_dns):
    # A plain-HTTP receiver cannot complete a TLS handshake: reaching that failure
    # (rather than a connect timeout to 10.255.255.1) shows the pinned address was used.
    with WebhookReceiver() as receiver:
        url = f"https://webhook.test:{receiver.port}/hook"
        result = send(url, event, secret, allow_hosts=LOCAL, timeout_s=2)
    assert not result.ok and result.status_code is None and not result.is_permanent
    assert "ssl" in result.error.lower()
    assert rebinding_dns == ["webhook.test"]


def test_send_refuses_when_dns_points_inside(event, secret, monkeypatch):
    monkeypatch.setattr(
        socket, "getaddrinfo",
        lambda host, port, *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))],
    )
    result = send("https://innocent.example/hook", event, secret)
    assert not result.ok and result.is_permanent
    assert "169.254.169.254" in result.error


def test_send_connect_timeout_is_reported_as_such(event, secret, monkeypatch):
    # A black-holed address needs a network to test against; stub the socket connect
    # instead, to check that a connect timeout is told apart from a read timeout.
    def black_hole(address, timeout=None, source_address=None):
        assert timeout == 0.25, "the connect timeout, not the read timeout"
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", black_hole)
    result = send("http://127.0.0.1:9/hook", event, secret, allow_hosts=LOCAL, timeout_s=5, connect_timeout_s=0.25)
    assert not result.ok and not result.is_permanent and result.status_code is None
    assert result.error == "timeout: connect timed out after 0.25s"
