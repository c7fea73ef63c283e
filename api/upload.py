"""Uploads kept off the heap: the request body counted as it arrives, the file copied to
storage in chunks with its limits checked on the way.

    BodyLimit        ASGI middleware: a request whose Content-Length, or whose body as it
                     streams in (chunked uploads have no length), passes the limit is
                     answered 413 before more of it is read or spooled
    checked_chunks   an uploaded file's chunks, refused mid-copy past max_bytes or
                     max_lines (jobs.api_files writes them as they come)

A 200 MB batch file is never held in memory whole: Starlette spools the multipart part to
a temporary file, and it goes from there to storage a MiB at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import BinaryIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError

UPLOAD_CHUNK_BYTES = 1 << 20


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._too_large(send)
            return
        received = 0
        exceeded = False

        async def counted_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True   # the app fails to parse what follows; its answer is replaced
                    return {"type": "http.disconnect"}
            return message

        replaced = False

        async def checked_send(message: Message) -> None:
            nonlocal replaced
            if exceeded and message["type"] == "http.response.start":
                replaced = True
                await self._too_large(send)
            elif not replaced:
                await send(message)

        await self.app(scope, counted_receive, checked_send)

    async def _too_large(self, send: Send) -> None:
        data = json.dumps(ApiError(413, f"the request is larger than {self.max_bytes} bytes").body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def checked_chunks(source: BinaryIO, max_bytes: int, max_lines: int) -> Iterator[bytes]:
    """`source` a MiB at a time; ApiError once it passes `max_bytes` (413) or holds more
    than `max_lines` lines (400), before the chunk past the limit is handed on."""
    size = lines = 0
    ends_in_newline = True
    while chunk := source.read(UPLOAD_CHUNK_BYTES):
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"the file is larger than {max_bytes} bytes", param="file")
        lines += chunk.count(b"\n")
        ends_in_newline = chunk.endswith(b"\n")
        if lines + (not ends_in_newline) > max_lines:
            raise ApiError(400, f"the file has more than {max_lines} lines; a batch file holds at most {max_lines} "
                                "requests", param="file")
        yield chunk
