"""`barge serve`: the OpenAI-compatible Files and Batches API, and the dashboard (api/).

    barge serve [--host 127.0.0.1] [--port 8000] [--allowed-host NAME ...] [--no-login-url]

Its keys are made with `barge api-key` (cli.api_key).
"""

from __future__ import annotations

import argparse


def add_commands(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the OpenAI Files and Batches API (FastAPI + uvicorn)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="a Host name to answer besides localhost, 127.0.0.1 and the bound address (e.g. the "
                            "name a proxy serves it under; '*.example.com' for its subdomains); repeatable. "
                            "Also BARGE_ALLOWED_HOSTS (comma-separated). Any other Host is answered 400")
    serve.add_argument("--no-login-url", dest="login_url", action="store_false",
                       help="print no one-time operator login URL at start")
    serve.add_argument("--public-url", default=None,
                       help="the URL people reach it by (behind a proxy: https://NAME), for the printed login URL")
    serve.add_argument("--secure-cookies", action="store_true",
                       help="mark the dashboard's session cookie Secure on every answer (behind a TLS proxy that "
                            "does not send X-Forwarded-Proto); an https request gets it anyway")
    serve.set_defaults(func=_serve)


def _serve(args) -> int:
    import os

    from api.serve import serve
    extra = [*args.allowed_host, *filter(None, os.environ.get("BARGE_ALLOWED_HOSTS", "").split(","))]
    return serve(args.host, args.port, args.log_level, allowed_hosts=extra, login_url=args.login_url,
                 secure_cookies=args.secure_cookies, public_url=args.public_url)
