"""api.upload: a request body counted as it streams in, a file checked as it is copied."""

import io
import os

import pytest
from fastapi import FastAPI, File, UploadFile
from fastapi.testclient import TestClient

from api.errors import ApiError
from api.upload import BodyLimit, checked_chunks
from jobs.api_files import _write_chunks

LIMIT = 4096


def _app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(BodyLimit, max_bytes=LIMIT)

    @app.post("/upload")
    def upload(file: UploadFile = File(...)) -> dict:
        return {"bytes": len(file.file.read())}

    return app


def _multipart(payload: bytes) -> tuple[bytes, str]:
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode() + payload + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("size, status", [(1000, 200), (LIMIT * 3, 413)])
def test_a_chunked_body_is_cut_off_at_the_limit_as_it_streams(size, status):
    body, content_type = _multipart(b"x" * size)
    chunks = iter([body[i:i + 512] for i in range(0, len(body), 512)])   # no Content-Length: chunked
    answer = TestClient(_app()).post("/upload", content=chunks, headers={"content-type": content_type})
    assert answer.status_code == status
    if status == 413:
        assert answer.json()["error"]["message"] == f"the request is larger than {LIMIT} bytes"
    else:
        assert answer.json() == {"bytes": size}


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    body, content_type = _multipart(b"x" * (LIMIT * 2))
    answer = TestClient(_app()).post("/upload", content=body, headers={"content-type": content_type})
    assert answer.status_code == 413


def test_checked_chunks_pass_a_file_within_its_limits_and_stop_past_them():
    data = b"{}\n" * 10
    assert b"".join(checked_chunks(io.BytesIO(data), max_bytes=len(data), max_lines=10)) == data
    with pytest.raises(ApiError) as too_big:
        list(checked_chunks(io.BytesIO(data), max_bytes=len(data) - 1, max_lines=10))
    assert too_big.value.status_code == 413
    with pytest.raises(ApiError, match="more than 9 lines") as too_long:
        list(checked_chunks(io.BytesIO(data), max_bytes=len(data), max_lines=9))
    assert too_long.value.status_code == 400
    with pytest.raises(ApiError):   # a last line without its newline counts too
        list(checked_chunks(io.BytesIO(data + b"{}"), max_bytes=1000, max_lines=10))


def test_a_failing_stream_leaves_no_file_behind(tmp_path):
    def chunks():
        yield b"first\n"
        raise ApiError(413, "too large")

    with pytest.raises(ApiError):
        _write_chunks(str(tmp_path), "file-1", chunks())
    assert os.listdir(tmp_path) == []
    assert _write_chunks(str(tmp_path), "file-2", iter([b"a\n", b"b\n"])) == 4
    assert (tmp_path / "file-2").read_bytes() == b"a\nb\n" and os.listdir(tmp_path) == ["file-2"]
