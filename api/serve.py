"""`barge serve`: the API under uvicorn."""

from __future__ import annotations


def serve(host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    import uvicorn

    from api.app import create_app
    uvicorn.run(create_app(), host=host, port=port, log_level=log_level)
    return 0
