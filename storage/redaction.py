"""What a person may see of a URL, a text or a JSON value: never a credential or token.

Barge's one redaction, for everything it shows: the CLI (`barge status`, `jobs`,
`webhooks ...`, `schedule runs`), the dashboard's pages and JSON, storage errors and log
lines (jobs.logs runs every record through it). Only display is redacted: a webhook
is still sent to the whole URL the user gave, a file still read from the whole URL.

URLs, wherever they sit in a text (recognised by their scheme, `name://`):

    userinfo        s3://AKIA:wJalr/K7@bucket/a   ->  s3://***@bucket/a
    query string    s3://bucket/a?versionId=3      ->  s3://bucket/a?***   (presigned signatures live here)
    web path        https://hooks.slack.com/services/T0/B0/XXXX  ->  https://hooks.slack.com/***
                    http://127.0.0.1:9000/         ->  http://127.0.0.1:9000/   (a bare "/" hides nothing)

NOTE: the path is masked for http, https, ws and wss only. Receivers carry their token
in the path (Slack's /services/T.../B.../XXXX, Discord's /api/webhooks/ID/TOKEN), so a web
URL's path is as secret as its query. Storage URLs keep theirs (s3://, gs://, az://,
file://, hf://, local paths, and database or broker URLs): a bucket path is a location
the user must see, and their tokens travel in the query (masked) or the userinfo (masked).
An https input or output therefore shows as host only; that is the price of one rule.

Values under names that hold secrets become ***, at any depth of a dict, whatever their
type (SECRET_NAME). In free text the same names are caught as `name=value`,
`name: value` and JSON's `"name": "value"`, beside shapes that are secrets whatever their
name: webhook signing secrets (whsec_...), AWS access key ids and Authorization values.
"""

from __future__ import annotations

import re
from typing import Any

HIDDEN = "***"

# A name holds a secret when it contains one of these, case-insensitively:
# aws_secret_access_key, client_secret, X-Signature, x-api-key, apiKey, private_key, ...
# NOTE: "token" counts only at the end of a name: token, auth_token, hf_token,
# access_token, X-Auth-Token and aws_session_token are secrets; max_tokens,
# max_completion_tokens, stop_token_ids and num_prompt_tokens are sampling parameters and
# counts the user must see. A tokenizer setting such as eos_token is masked too (harmless).
SECRET_NAME = re.compile(r"secret|password|passwd|credential|authorization|signature|cookie"
                         r"|(?:api|access|account|private)[_-]?key|token$", re.IGNORECASE)

_WEB_SCHEMES = frozenset({"http", "https", "ws", "wss"})
# scheme :// [userinfo @] host [path] [?query] [#fragment]. A password may hold "/" (an
# AWS secret key does), so userinfo is "user:anything@"; without ":" it cannot cross "/",
# which keeps s3://bucket/key@v1 and ...?email=a@b from reading as userinfo.
_URL = re.compile(r"^(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*)://"
                  r"(?P<userinfo>(?:[^/@\s?#:]*:[^@\s?#]*|[^/@\s?#]*)@)?"
                  r"(?P<host>[^/?#\s]*)(?P<path>[^?#\s]*)(?P<query>\?[^#\s]*)?(?P<fragment>#\S*)?$")
# A URL anywhere in a longer text: an endpoint inside a backend's error, a log line. It
# does not end in punctuation, so "...?sig=1: 403" keeps its colon.
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://(?:[^\s\"'<>]*[^\s\"'<>.,:;!?)\]}])?")
# `name=value`, `name: value`, `"name": "value"`, `'name': 'value'`; the name decides. The
# value is only looked at, not consumed, so that in "error: password=x" the scan that
# passes over "error: " still finds "password=".
_NAMED_VALUE = re.compile(r"""\b(?P<name>[A-Za-z_][\w.-]*)(?P<sep>["']?\s*[=:]\s*)"""
                          r"""(?=(?P<value>"(?:[^"\\]|\\.)*"|'[^']*'|[^\s"',;&]+))""")
_SHAPED_SECRETS = (
    (re.compile(r"whsec_[A-Za-z0-9+/=_-]+"), "whsec_" + HIDDEN),                     # webhook signing secrets
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), HIDDEN),                          # AWS access key ids
    # "Authorization: Bearer abc": the scheme word is not the secret, what follows it is
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|basic|token)\s+)?[^\s\"',;]+"),
     r"\1" + HIDDEN),
)


# The id of a key names the key, it is not it: api_key_id is the Barge key that owns a batch
# (the dashboard and webhook bodies show whose job it is), aws_access_key_id an AKIA... id,
# masked in any case by its shape (the AKIA pattern above). A name that also says secret,
# password or token stays a secret.
_KEY_ID = re.compile(r"key[_-]?id$", re.IGNORECASE)
_SECRET_WORD = re.compile(r"secret|password|passwd|credential|token|signature", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    if SECRET_NAME.search(name) is None:
        return False
    return not (_KEY_ID.search(name) and not _SECRET_WORD.search(name))


def redact_url(url: str) -> str:
    """`url` as it may be shown: userinfo and query masked, and a web URL's path too.
    Text that is not a URL (a local path) is returned as it is."""
    parts = _URL.match(url)
    if parts is None:
        return url
    shown = f"{parts['scheme']}://{HIDDEN + '@' if parts['userinfo'] else ''}{parts['host']}"
    if parts["scheme"].lower() in _WEB_SCHEMES:
        rest = url[parts.end("host"):]
        return shown + (rest if rest in ("", "/") else "/" + HIDDEN)
    query = f"?{HIDDEN}" if parts["query"] else ""
    return f"{shown}{parts['path']}{query}{parts['fragment'] or ''}"


def redact_text(text: str | None) -> str | None:
    """`text` (an error, a log line, a JSON dump) with every URL redacted and every
    secret-shaped value masked; None stays None."""
    if text is None:
        return None
    text = _URL_IN_TEXT.sub(lambda match: redact_url(match.group(0)), text)
    for pattern, replacement in _SHAPED_SECRETS:
        text = pattern.sub(replacement, text)
    return _mask_named_values(text)


def redact_value(value: Any) -> Any:
    """`value` (a spec, metadata, a webhook body, any JSON) with secret-named values
    hidden at any depth and every string through redact_text."""
    if isinstance(value, dict):
        return {key: HIDDEN if item is not None and is_secret_name(str(key)) else redact_value(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _mask_named_values(text: str) -> str:
    shown, end = [], 0   # end: how far `text` is copied or masked
    for match in _NAMED_VALUE.finditer(text):
        if match.start() < end or not is_secret_name(match["name"]):
            continue
        value = match["value"]
        quote = value[0] if value[0] in "\"'" else ""
        shown += [text[end:match.end()], f"{quote}{HIDDEN}{quote}"]
        end = match.end() + len(value)
    return "".join(shown) + text[end:]
