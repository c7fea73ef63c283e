"""`barge serve`: the API under uvicorn."""

from __future__ import annotations


def serve(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    import uvicorn

    from api.app import create_app
    from api.dashboard.access import is_loopback
    # bound to loopback, the dashboard opens without a key for whoever is on this machine
    uvicorn.run(create_app(dashboard_keyless=is_loopback(host)), host=host, port=port, log_level=log_level)
    return 0
