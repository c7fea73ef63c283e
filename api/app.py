"""The FastAPI app of `barge serve`: OpenAI's Files and Batches endpoints.

Every route needs `Authorization: Bearer <key>` (a key made by `barge api-key create`),
checked on the headers before any body is read (api.auth), and sees only that key's
files and batches. Every error, ours or the framework's, answers in OpenAI's shape
(api.errors); ids are checked against our own formats before they reach SQL or a path.
The dashboard (api.dashboard) is mounted beside them under /dashboard: the same keys, or
a session opened with one (an operator key, or the one-time login URL, sees every job).
"""

from __future__ import annotations

import os
from dataclasses import replace

import logging

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from api.auth import DEFAULT_ALLOWED_HOSTS, Gate, LoginTicket, Principal
from api.dashboard import dashboard_router
from api.dashboard.routes import mount_static
from api.errors import ApiError
from api.service import ApiSettings, BatchService
from api.upload import BodyLimit
from jobs.api_files import FileRecord
from jobs.api_keys import ApiKey, ApiKeys
from jobs.client import Client
from jobs.dashboard_sessions import DashboardSessions
from jobs.settings import Settings

log = logging.getLogger("barge.api")

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
               allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS, login_ticket: LoginTicket | None = None,
               secure_cookies: bool = False) -> FastAPI:
    """`allowed_hosts`: the `Host` names answered (api.auth.allowed_hosts_for);
    `login_ticket`: the one-time login URL's secret `barge serve` prints (None: no such URL);
    `secure_cookies`: the session cookie is `Secure` on every answer, not only on https ones."""
    client = client or Client()
    service = BatchService(client, api_settings or api_settings_from_env(client.settings))
    keys, sessions = ApiKeys(client.store.engine), DashboardSessions(client.store.engine)
    app = FastAPI(title="Barge: the OpenAI Batch API", docs_url=None, redoc_url=None)
    _add_error_handlers(app, service.settings.max_file_bytes + REQUEST_OVERHEAD_BYTES)
    app.include_router(dashboard_router(client.store, sessions, keys, login_ticket=login_ticket,
                                        secure_cookies=secure_cookies))
    mount_static(app)
    app.add_middleware(Gate, keys=keys, sessions=sessions, allowed_hosts=allowed_hosts)   # outermost: before bodies

    def caller(request: Request) -> ApiKey:
        """The key the gate found on the headers; the API takes no dashboard session."""
        principal: Principal | None = request.state.principal
        if principal is None or principal.key is None or principal.session_id is not None:
            raise ApiError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.")
        return principal.key

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

    @app.exception_handler(HTTPException)
    def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        """The framework's own answers (unknown route 404, wrong method 405) in OpenAI's shape."""
        message = {404: "Unknown request URL.", 405: "Method not allowed for this URL."}.get(
            error.status_code, str(error.detail)[:200])
        return JSONResponse(ApiError(error.status_code, message).body(), status_code=error.status_code,
                            headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    def server_error(request: Request, error: Exception) -> JSONResponse:
        """A fault of ours: logged with its traceback, answered in OpenAI's shape without it."""
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return JSONResponse(ApiError(500, "The server had an error while processing your request.").body(),
                            status_code=500)

    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)   # counted as it streams in (api.upload)


def _file_object(record: FileRecord) -> dict:
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": int(record.created_at),
            "filename": record.filename, "purpose": record.purpose, "status": "processed", "expires_at": None,
            "status_details": None}
