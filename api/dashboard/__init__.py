"""The dashboard of `barge serve`: read-only pages over the SQL store and the workers'
heartbeats (jobs, a job, workers, schedules), server-rendered with Jinja2, with one
small script for live updates and inline SVG charts. Everything it serves ships in
this package: no CDN, no build step."""

from api.dashboard.routes import dashboard_router

__all__ = ["dashboard_router"]
