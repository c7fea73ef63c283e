"""The dashboard's routes under /dashboard: four pages (jobs, a job, workers,
schedules), their JSON twins under /dashboard/api, a login form for a key (and the
one-time login URL's landing), logout, and the package's static files. Every page is
read-only; every answer says no-store and carries a Content-Security-Policy that allows
only this server's own script and styles. Login and logout come only from this server's
own origin (api.auth checks Origin before the form is read)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.auth import SESSION_COOKIE, LoginTicket
from api.dashboard import fleet
from api.dashboard.access import PREFIX, NeedsKey, Viewer, viewer as viewer_of
from api.dashboard.job_page import clock, job_page
from api.dashboard.reads import DashboardReads
from api.errors import ApiError
from jobs.api_keys import ApiKeys
from jobs.dashboard_sessions import DashboardSessions
from jobs.status import JobStatus
from jobs.store import Store
from jobs.throughput import format_duration, format_rate

HERE = Path(__file__).parent
HEADERS = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
           "X-Content-Type-Options": "nosniff",
           "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                      "connect-src 'self'; form-action 'self'; frame-ancestors 'none'"}
STATUSES = {str(s) for s in JobStatus}


def templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
    env.filters.update(duration=format_duration, clock=lambda t: "-" if t is None else clock(t), rate=format_rate)
    return env


def dashboard_router(store: Store, sessions: DashboardSessions, keys: ApiKeys, *,
                     login_ticket: LoginTicket | None = None, secure_cookies: bool = False) -> APIRouter:
    reads, env = DashboardReads(store), templates()
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    def page(name: str, viewer: Viewer | None, status_code: int = 200, **context) -> HTMLResponse:
        html = env.get_template(name).render(viewer=viewer, prefix=PREFIX, **context)
        return HTMLResponse(html, status_code=status_code, headers=HEADERS)

    def answer(request: Request, render):
        """The viewer's page, or the login form (HTML) / 401 (JSON) without a usable key."""
        try:
            viewer = viewer_of(request)
        except NeedsKey as needs:
            if request.url.path.startswith(f"{PREFIX}/api/"):
                return json_answer(ApiError(401, needs.message).body(), 401)
            return page("login.html", None, 401, error=needs.message, next_path=request.url.path)
        return render(viewer)

    def json_answer(value, status_code: int = 200) -> JSONResponse:
        return JSONResponse(value, status_code=status_code, headers=HEADERS)

    def filters(status: str | None, model: str | None, schedule: str | None) -> dict:
        return {"status": status if status in STATUSES else None, "model": model or None, "schedule": schedule or None}

    @router.get("", response_class=HTMLResponse)
    @router.get("/", response_class=HTMLResponse)
    def home() -> Response:
        return RedirectResponse(f"{PREFIX}/jobs", status_code=303)

    @router.get("/jobs", response_class=HTMLResponse)
    def jobs_page(request: Request, status: str | None = None, model: str | None = None,
                  schedule: str | None = None, before: str | None = None) -> Response:
        chosen, before = filters(status, model, schedule), before or None

        def render(viewer: Viewer) -> Response:
            try:
                listed = reads.jobs(viewer.key_id, before=before, **chosen)
            except KeyError:
                return page("missing.html", viewer, 404, what=f"job {before}")
            return page("jobs.html", viewer, **listed, before=before, chosen=chosen,
                        shown={name: value for name, value in chosen.items() if value},
                        options=reads.job_filters(viewer.key_id))
        return answer(request, render)

    @router.get("/api/jobs")
    def jobs_json(request: Request, status: str | None = None, model: str | None = None,
                  schedule: str | None = None, before: str | None = None) -> Response:
        """{"jobs": [...], "next_before": the id to pass as ?before= for the next, older page, or null}."""
        chosen, before = filters(status, model, schedule), before or None

        def render(viewer: Viewer) -> Response:
            try:
                return json_answer(reads.jobs(viewer.key_id, before=before, **chosen))
            except KeyError:
                return json_answer(ApiError(404, "No job found with that id.").body(), 404)
        return answer(request, render)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse)
    def one_job_page(request: Request, job_id: str, fragment: bool = False) -> Response:
        def render(viewer: Viewer) -> Response:
            if not reads.can_see(viewer.key_id, job_id):
                return page("missing.html", viewer, 404, what=f"job {job_id}")
            return page("job_live.html" if fragment else "job.html", viewer, **job_page(reads, job_id))
        return answer(request, render)

    @router.get("/api/jobs/{job_id}")
    def one_job_json(request: Request, job_id: str) -> Response:
        def render(viewer: Viewer) -> Response:
            if not reads.can_see(viewer.key_id, job_id):
                return json_answer(ApiError(404, "No job found with that id.").body(), 404)
            found = job_page(reads, job_id)
            found.pop("charts")
            return json_answer(found)
        return answer(request, render)

    @router.get("/workers", response_class=HTMLResponse)
    def workers_page(request: Request, fragment: bool = False) -> Response:
        return answer(request, lambda viewer: page("workers_live.html" if fragment else "workers.html", viewer,
                                                   workers=fleet.workers(store, viewer.key_id),
                                                   stale_s=fleet.STALE_BEAT_S))

    @router.get("/api/workers")
    def workers_json(request: Request) -> Response:
        return answer(request, lambda viewer: json_answer({"workers": fleet.workers(store, viewer.key_id)}))

    @router.get("/schedules", response_class=HTMLResponse)
    def schedules_page(request: Request, fragment: bool = False) -> Response:
        return answer(request, lambda viewer: page(
            "schedules_live.html" if fragment else "schedules.html", viewer,
            schedules=fleet.schedules(store) if viewer.is_operator else None))

    def logged_in(request: Request, key) -> Response:
        """A new session for `key` (None: the operator), its id in the cookie, on to the jobs list."""
        done = RedirectResponse(f"{PREFIX}/jobs", status_code=303, headers=HEADERS)
        done.set_cookie(SESSION_COOKIE, sessions.start(key), httponly=True, samesite="strict", path=PREFIX,
                        secure=secure_cookies or request.url.scheme == "https")
        return done

    @router.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, ticket: str | None = None) -> Response:
        """The form; with `?ticket=` (the URL `barge serve` printed), an operator session once."""
        if ticket is not None:
            if login_ticket is not None and login_ticket.redeem(ticket):
                return logged_in(request, None)
            return page("login.html", None, 401, next_path=f"{PREFIX}/jobs",
                        error="that login URL has been used or is not this server's; log in with a key, or "
                              "restart `barge serve` for a new URL")
        return page("login.html", None, error=None, next_path=f"{PREFIX}/jobs")

    @router.post("/login", response_class=HTMLResponse)
    def login(request: Request, key: str = Form(..., max_length=200)) -> Response:
        found = keys.authenticate(key.strip())
        if found is None:
            return page("login.html", None, 401, error="that API key is not valid (unknown or revoked)",
                        next_path=f"{PREFIX}/jobs")
        return logged_in(request, found)

    @router.post("/logout")
    def logout(request: Request) -> Response:
        """Ends the session on the server: a copy of its cookie opens nothing afterwards."""
        if getattr(request.state, "principal", None) is not None and request.state.principal.session_id:
            sessions.end(request.state.principal.session_id)
        done = RedirectResponse(f"{PREFIX}/login", status_code=303, headers=HEADERS)
        done.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return done

    return router


def mount_static(app) -> None:
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="dashboard-static")
