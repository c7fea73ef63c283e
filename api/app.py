"""The FastAPI app of `barge serve`: OpenAI's Files and Batches endpoints.

Every route needs `Authorization: Bearer <key>` (a key made by `barge api-key create`)
and sees only that key's files and batches. Errors answer in OpenAI's shape
(api.errors); ids are checked against our own formats before they reach SQL or a path.
The dashboard (api.dashboard) is mounted beside them under /dashboard, with its own
access rule: the same keys, or none from loopback when the server is bound there.
"""

from __future__ import annotations

import os
from dataclasses import replace

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from api.dashboard import dashboard_router
from api.dashboard.routes import mount_static
from api.errors import ApiError
from api.service import ApiSettings, BatchService
from api.upload import BodyLimit
from jobs.api_files import FileRecord
from jobs.api_keys import ApiKey, ApiKeys
from jobs.client import Client
from jobs.settings import Settings

REQUEST_OVERHEAD_BYTES = 1 << 20   # multipart framing and form fields beyond the file itself


class BatchCreate(BaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict | None = None


def api_settings_from_env(settings: Settings, env: dict[str, str] | None = None) -> ApiSettings:
    env = os.environ if env is None else env
    defaults = ApiSettings(files_url=env.get("BARGE_API_FILES_URL") or str(settings.data_dir / "api"))
    return replace(defaults, max_file_bytes=int(env.get("BARGE_API_MAX_FILE_BYTES") or defaults.max_file_bytes),
                   rows_per_shard=int(env.get("BARGE_API_ROWS_PER_SHARD") or defaults.rows_per_shard),
                   orphan_after_s=float(env.get("BARGE_API_ORPHAN_AFTER_S") or defaults.orphan_after_s))


def create_app(client: Client | None = None, api_settings: ApiSettings | None = None, *,
               dashboard_keyless: bool = False) -> FastAPI:
    """`dashboard_keyless`: the dashboard lets a loopback visitor without a key see
    every job (api.dashboard.access); `barge serve` sets it when bound to loopback."""
    client = client or Client()
    service = BatchService(client, api_settings or api_settings_from_env(client.settings))
    keys = ApiKeys(client.store.engine)
    app = FastAPI(title="Barge: the OpenAI Batch API", docs_url=None, redoc_url=None)
    _add_error_handlers(app, service.settings.max_file_bytes + REQUEST_OVERHEAD_BYTES)
    app.include_router(dashboard_router(client.store, keys, keyless_on_loopback=dashboard_keyless))
    mount_static(app)

    def caller(request: Request) -> ApiKey:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
        key = keys.authenticate(token.strip())
        if key is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return key

    @app.post("/v1/files")
    def upload_file(file: UploadFile = File(...), purpose: str = Form(...), key: ApiKey = Depends(caller)) -> dict:
        return _file_object(service.upload(key.id, purpose, file.filename or "upload.jsonl", file.file))

    @app.get("/v1/files")
    def list_files(purpose: str | None = None, after: str | None = None, limit: int = Query(10_000, ge=1, le=10_000),
                   key: ApiKey = Depends(caller)) -> dict:
        files, has_more = service.files.list(key.id, purpose=purpose, after=after, limit=limit)
        data = [_file_object(f) for f in files]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": has_more}

    @app.get("/v1/files/{file_id}")
    def get_file(file_id: str, key: ApiKey = Depends(caller)) -> dict:
        return _file_object(service.file(key.id, file_id))

    @app.get("/v1/files/{file_id}/content")
    def file_content(file_id: str, key: ApiKey = Depends(caller)) -> Response:
        record = service.file(key.id, file_id)
        return Response(service.files.content(record), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}")
    def delete_file(file_id: str, key: ApiKey = Depends(caller)) -> dict:
        record = service.file(key.id, file_id)
        service.files.delete(key.id, record.id)
        return {"id": record.id, "object": "file", "deleted": True}

    @app.post("/v1/batches")
    def create_batch(body: BatchCreate, key: ApiKey = Depends(caller)) -> dict:
        return service.create(key.id, body.input_file_id, body.endpoint, body.completion_window, body.metadata)

    @app.get("/v1/batches")
    def list_batches(after: str | None = None, limit: int = Query(20, ge=1, le=100),
                     key: ApiKey = Depends(caller)) -> dict:
        batches, has_more = service.list(key.id, after, limit)
        return {"object": "list", "data": batches, "first_id": batches[0]["id"] if batches else None,
                "last_id": batches[-1]["id"] if batches else None, "has_more": has_more}

    @app.get("/v1/batches/{batch_id}")
    def get_batch(batch_id: str, key: ApiKey = Depends(caller)) -> dict:
        return service.get(key.id, batch_id)

    @app.post("/v1/batches/{batch_id}/cancel")
    def cancel_batch(batch_id: str, key: ApiKey = Depends(caller)) -> dict:
        return service.cancel(key.id, batch_id)

    return app


def _add_error_handlers(app: FastAPI, max_request_bytes: int) -> None:
    @app.exception_handler(ApiError)
    def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    def invalid_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
        return JSONResponse(ApiError(400, f"{param or 'request'}: {first.get('msg', 'invalid request')}",
                                     param=param).body(), status_code=400)

    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)   # counted as it streams in (api.upload)


def _file_object(record: FileRecord) -> dict:
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": int(record.created_at),
            "filename": record.filename, "purpose": record.purpose, "status": "processed", "expires_at": None,
            "status_details": None}
