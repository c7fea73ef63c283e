"""`barge serve`: the API under uvicorn.

At start it prints the one-time login URL of the dashboard (api.auth.LoginTicket) to
stderr, for the person at the machine, as Jupyter prints its token. uvicorn's access log
is kept, without query strings: a key or ticket someone put in a URL never lands in a log.
Barge's own log lines go through jobs.logs' handler, which redacts them (storage.redaction).
"""

from __future__ import annotations

import logging
import sys

from api.auth import LoginTicket, allowed_hosts_for


class NoQueryStrings(logging.Filter):
    """uvicorn's access line is `'%s - "%s %s HTTP/%s" %d'` over (client, method, path with
    its query, version, status): the query goes, the path stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 3 and isinstance(record.args[2], str):
            record.args = (*record.args[:2], record.args[2].partition("?")[0], *record.args[3:])
        return True


def serve(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", *,
          allowed_hosts: list[str] | tuple[str, ...] = (), login_url: bool = True, secure_cookies: bool = False,
          public_url: str | None = None) -> int:
    import uvicorn

    from api.app import api_settings_from_env, create_app
    from api.batch_adapters import lora_modules
    from jobs.client import Client
    from jobs.hosts import check_setting
    from jobs.settings import Settings
    from jobs.logs import configure_logging

    settings = Settings.from_env()
    api_settings = api_settings_from_env(settings)
    # many hosts: the workers read each batch's input from, and write its output to, the API's files
    check_setting("BARGE_API_FILES_URL", api_settings.files_url, settings)
    for name, location in lora_modules().items():   # what batch lines name as BASE:ADAPTER, read by the workers
        check_setting(f"BARGE_LORA_MODULES ({name})", location, settings)
    client = Client(settings=settings)   # after the check: a refused server touches no store

    configure_logging(log_level.upper())   # Barge's own lines: through the redaction, as a worker's
    ticket = LoginTicket() if login_url else None
    app = create_app(client, api_settings, allowed_hosts=allowed_hosts_for(host, allowed_hosts),
                     login_ticket=ticket, secure_cookies=secure_cookies)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level)   # configures logging
    logging.getLogger("uvicorn.access").addFilter(NoQueryStrings())
    if ticket is not None:
        base = (public_url or f"http://{_shown_host(host)}:{port}").rstrip("/")
        print(f"barge serve: the dashboard, for the operator, once: {base}/dashboard/login?ticket={ticket.token}",
              file=sys.stderr, flush=True)
    uvicorn.Server(config).run()
    return 0


def _shown_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
