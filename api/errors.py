"""Errors as OpenAI's API answers them: an HTTP status and
{"error": {"message", "type", "param", "code"}}, which the `openai` package turns into
its own exceptions (401 AuthenticationError, 404 NotFoundError, ...)."""

from __future__ import annotations

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
               404: "invalid_request_error", 405: "invalid_request_error", 409: "invalid_request_error",
               413: "invalid_request_error", 500: "server_error"}


class ApiError(Exception):
    def __init__(self, status_code: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status_code, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def not_found(kind: str, object_id: str, *, param: str | None = None) -> ApiError:
    """Unknown, deleted and another key's objects read the same. The id is echoed only
    when it has the shape of one of ours, so the answer never repeats arbitrary input."""
    shown = object_id if object_id.replace("-", "").replace("_", "").isalnum() and len(object_id) <= 64 else "(invalid)"
    return ApiError(404, f"No {kind} found with id '{shown}'.", param=param, code=None)
