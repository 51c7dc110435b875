"""Airflow 3 plugin: the reclock progress page.

Registers a FastAPI app that the API server mounts at ``/reclock``:

* ``GET /reclock/`` — HTML page (inline SVG charts, no script, no external asset; the
  trailing slash matters: ``/reclock`` is not mounted and falls through to the Airflow UI);
* ``GET /reclock/api/progress`` — the same data as JSON;
* ``GET /reclock/gx/<source>/<page>`` — the source's Great Expectations Data Docs site (the pages the last
  check links to; :mod:`reclock.gx_context`).

and a UI menu entry (Browse › Reclock progress) that shows the page in an iframe at
``/plugin/reclock-progress``.  Both endpoints need a user who may see the Airflow UI
(the ``_token`` cookie the UI sets, or a ``Bearer`` token).  The sources come from
``$RECLOCK_CONFIG`` (else ``include/sources.yaml``) in the API server's environment.
Everything but the wiring lives in :mod:`reclock.progress` and :mod:`reclock.progress_view`.
"""
from __future__ import annotations

import asyncio

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/reclock"


async def _collect() -> dict:
    from reclock.progress import collect

    # Reads the Delta tables only (blocking): the upstream lag is the last one the pipeline measured, so a page
    # opened while an upstream is down shows it, and page loads never wait on upstreams.
    return await asyncio.to_thread(collect, upstream=False)


app = FastAPI(title="reclock progress", dependencies=[Depends(requires_access_view(AccessView.WEBSITE))])


@app.get("/", response_class=HTMLResponse)
async def progress_page() -> HTMLResponse:
    from reclock.progress_view import render_page

    return HTMLResponse(render_page(await _collect()), headers={"Cache-Control": "no-store"})


@app.get("/api/progress")
async def progress_json() -> JSONResponse:
    return JSONResponse(await _collect(), headers={"Cache-Control": "no-store"})


@app.get("/gx/{source}/{page:path}")
async def data_docs(source: str, page: str) -> FileResponse:
    from reclock.progress import data_docs_file

    path = await asyncio.to_thread(data_docs_file, source, page)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no Data Docs page {page!r} for source {source!r}")
    return FileResponse(path, headers={"Cache-Control": "no-store"})


class ReclockProgressPlugin(AirflowPlugin):
    name = "reclock"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "reclock progress"}]
    external_views = [{
        "name": "Reclock progress",
        "href": "reclock/",  # relative to the UI's base URL, so it works under a base_url path too
        "url_route": "reclock-progress",
        "destination": "nav",
        "category": "browse",
    }]
