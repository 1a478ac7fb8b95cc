"""The ASGI app serving every bundled site under a per-episode session prefix.

URL scheme: `/s/<session>/<site>/<path>` (sites: launcher, shop, forum, settings); `/__state__/<session>`
returns that session's state as JSON (GET) or drops it (DELETE, the episode reset); `/healthz` answers "ok".
Handlers are plain functions of a `Ctx`, so the whole app is a few routes around them.
"""

from __future__ import annotations

from typing import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from jaxagent.envs.sites import catalog, forum, phone, shop
from jaxagent.envs.sites import state as state_lib
from jaxagent.envs.sites.layout import Ctx, Redirect, page

HANDLERS: dict[str, Callable[[Ctx], object]] = {
    "launcher": lambda ctx: phone.launcher(ctx) if not ctx.path.strip("/") else None,
    "shop": shop.handle,
    "forum": forum.handle,
    "settings": phone.settings,
}
SITES = tuple(HANDLERS)


def create_app(seed: int = 0, store: state_lib.SessionStore | None = None) -> Starlette:
  """The app for the world of `seed`; `store` holds the sessions (a fresh one by default)."""
  world = catalog.build_world(seed)
  store = store or state_lib.SessionStore()

  async def site_page(request: Request) -> Response:
    session, site = request.path_params["session"], request.path_params["site"]
    path = request.path_params.get("path", "")
    if site not in HANDLERS:
      return PlainTextResponse(f"unknown site {site!r}; sites are {list(SITES)}", status_code=404)
    try:
      store.check_id(session)
    except ValueError as e:
      return PlainTextResponse(str(e), status_code=400)
    form = dict(await request.form()) if request.method == "POST" else {}
    with store.lock():
      state = store.get(session)
      state.requests += 1
      ctx = Ctx(world=world, state=state, session=session, root=f"/s/{session}", path=path,
                query=dict(request.query_params), form={k: str(v) for k, v in form.items()}, method=request.method)
      out = HANDLERS[site](ctx)
    if out is None:
      body = page(ctx, site=site, title="Not found", body=f"<h1>Page not found</h1><p><a href='{ctx.url(site + '/')}'>"
                  f"Back to the start page</a></p>")
      return HTMLResponse(body, status_code=404)
    if isinstance(out, Redirect):
      return RedirectResponse(out.location, status_code=303)
    return HTMLResponse(out)

  async def site_root(request: Request) -> Response:
    return RedirectResponse(f"/s/{request.path_params['session']}/{request.path_params['site']}/", status_code=307)

  async def session_state(request: Request) -> Response:
    session = request.path_params["session"]
    if request.method == "DELETE":
      store.reset(session)
      return JSONResponse({"reset": session})
    with store.lock():
      st = store.peek(session)
      return JSONResponse({"session": session, "exists": st is not None,
                           **(st or state_lib.SessionState()).to_json()})

  async def healthz(request: Request) -> Response:
    return PlainTextResponse(f"ok seed={seed} sessions={len(store)}")

  app = Starlette(routes=[
      Route("/healthz", healthz),
      Route("/__state__/{session}", session_state, methods=["GET", "DELETE"]),
      Route("/s/{session}/{site}", site_root),
      Route("/s/{session}/{site}/{path:path}", site_page, methods=["GET", "POST"]),
  ])
  app.state.store = store
  app.state.world = world
  return app
