"""What the dashboard shows of a spec, an error or a URL: never a secret.

A job's spec can hold URLs with credentials or tokens (input, output, webhook_url, a
URL in metadata) and free-form values under secret-looking names. Every string goes
through storage.fs.redact_urls (userinfo and query strings become ***), and the value of
any key that names a secret becomes ***, however deep it sits.
"""

from __future__ import annotations

import re
from typing import Any

from storage.fs import redact_urls

HIDDEN = "***"
# "token" only at the end of a name: auth_token is a secret, max_tokens and stop_token_ids are not
SECRET_NAME = re.compile(r"secret|token$|password|passwd|credential|(api|access|private)[_-]?key|authorization",
                         re.IGNORECASE)


def redact_value(value: Any) -> Any:
    """`value` (a spec, metadata, any JSON) with URLs redacted and secret-named values hidden."""
    if isinstance(value, dict):
        return {key: _redact_item(str(key), item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _redact_item(name: str, item: Any) -> Any:
    if item is not None and SECRET_NAME.search(name):
        return HIDDEN
    if name.endswith("webhook_url") and isinstance(item, str):
        return redact_webhook_url(item)
    return redact_value(item)


def redact_text(text: str | None) -> str | None:
    return None if text is None else redact_urls(text)


def redact_webhook_url(url: str | None) -> str | None:
    """A webhook URL as scheme://host/***: receivers often carry a token in the path
    (Slack's /services/T.../B.../XXXX), which redact_urls would leave."""
    if url is None:
        return None
    match = re.match(r"^([a-z][a-z0-9+.-]*://)(?:[^@/]*@)?([^/?#]*)(.*)$", url, re.IGNORECASE)
    if match is None:
        return HIDDEN
    scheme, host, rest = match.groups()
    return f"{scheme}{host}/{HIDDEN}" if rest not in ("", "/") else f"{scheme}{host}/"


_URL_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


def redact_webhook_text(text: str | None) -> str | None:
    """A delivery error: every URL in it shown as a webhook URL (its path may be a token)."""
    return None if text is None else _URL_IN_TEXT.sub(lambda match: redact_webhook_url(match.group(0)), text)
