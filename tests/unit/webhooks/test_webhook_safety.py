import ipaddress

import pytest

from webhooks.safety import (
    ALLOW_HOSTS_ENV,
    UnsafeDestinationError,
    allow_hosts_from_env,
    check_destination,
    is_public_address,
    validate_webhook_url,
)


@pytest.fixture(autouse=True)
def no_env_allow_list(monkeypatch):
    monkeypatch.delenv(ALLOW_HOSTS_ENV, raising=False)


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hooks/barge",
        "http://example.com",
        "HTTPS://Example.COM:8443/a?b=c",
        "http://127.0.0.1:8080/hook",  # syntax only; the address is checked at delivery
        "https://[2001:db8::1]/hook",
    ],
)
def test_valid_urls(url):
    validate_webhook_url(url)


@pytest.mark.parametrize(
    "url, problem",
    [
        ("ftp://example.com/hook", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("example.com/hook", "scheme"),
        ("https:///hook", "no host"),
        ("https://", "no host"),
        ("https://user:pass@example.com/hook", "credentials"),
        ("https://token@example.com/hook", "credentials"),
        ("https://example.com:99999/hook", "port"),
        ("https://example.com/a b", "whitespace"),
        ("https://example.com/" + "a" * 2048, "too long"),
        ("", "non-empty"),
    ],
)
def test_invalid_urls_name_the_problem(url, problem):
    with pytest.raises(ValueError, match=f"webhook_url: .*{problem}"):
        validate_webhook_url(url)


@pytest.mark.parametrize(
    "address, is_public",
    [
        ("93.184.215.14", True),
        ("2606:2800:21f:cb07:6820:80da:af6b:8b2c", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.100.100.200", False),  # carrier-grade NAT range, also a cloud metadata address
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("240.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00:ec2::254", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
    ],
)
def test_is_public_address(address, is_public):
    assert is_public_address(ipaddress.ip_address(address)) is is_public


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://localhost/hook",
    ],
)
def test_check_destination_refuses_internal_addresses(url):
    with pytest.raises(UnsafeDestinationError, match="non-public"):
        check_destination(url)


@pytest.mark.parametrize(
    "url, allow_hosts",
    [
        ("http://127.0.0.1:8080/hook", ["127.0.0.1"]),
        ("http://localhost/hook", ["localhost"]),
        ("http://localhost/hook", ["127.0.0.1", "::1"]),  # by address after resolving
        ("http://10.0.0.5/hook", ["10.0.0.0/8"]),
        ("http://[::1]:8080/hook", ["::1"]),
        ("http://[::1]:8080/hook", ["[::1]"]),
    ],
)
def test_check_destination_allows_allow_listed(url, allow_hosts):
    check_destination(url, allow_hosts=allow_hosts)


def test_check_destination_reads_env_allow_list(monkeypatch):
    monkeypatch.setenv(ALLOW_HOSTS_ENV, "127.0.0.1, localhost")
    check_destination("http://127.0.0.1:9/hook")
    check_destination("http://LOCALHOST:9/hook")
    with pytest.raises(UnsafeDestinationError):
        check_destination("http://169.254.169.254/")


def test_allow_list_for_one_host_does_not_open_another():
    with pytest.raises(UnsafeDestinationError):
        check_destination("http://169.254.169.254/", allow_hosts=["127.0.0.1"])


def test_check_destination_allows_public_literal_without_dns():
    check_destination("https://93.184.215.14/hook")


def test_check_destination_refuses_bad_url_as_unsafe():
    with pytest.raises(UnsafeDestinationError, match="scheme"):
        check_destination("gopher://127.0.0.1/")


def test_unsafe_destination_error_is_value_error():
    assert issubclass(UnsafeDestinationError, ValueError)


def test_allow_hosts_from_env_parses_commas():
    assert allow_hosts_from_env({ALLOW_HOSTS_ENV: " a.example , 127.0.0.1,,"}) == ("a.example", "127.0.0.1")
    assert allow_hosts_from_env({}) == ()
