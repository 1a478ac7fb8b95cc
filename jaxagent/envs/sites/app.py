"""The ASGI app serving every bundled site under a per-episode session prefix.

URL scheme: `/s/<session>/<site>/<path>` (sites: launcher, shop, forum, settings); `/__state__/<session>`
returns that session's state as JSON (GET) or drops it (DELETE, the episode reset); `POST /__episode__/<session>`
starts a fresh episode there with the perturbations its JSON body names (`perturb.Perturbation`); `/healthz`
answers "ok". Handlers are plain functions of a `Ctx`; `respond` runs one request against a session's state, the
same function for the HTTP server and for in-process exploration of the sites (`linkgraph`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from jaxagent.envs.sites import catalog, forum, perturb, phone, shop
from jaxagent.envs.sites import state as state_lib
from jaxagent.envs.sites.layout import Ctx, Redirect, esc, page

HANDLERS: dict[str, Callable[[Ctx], object]] = {
    "launcher": lambda ctx: phone.launcher(ctx) if not ctx.path.strip("/") else None,
    "shop": shop.handle,
    "forum": forum.handle,
    "settings": phone.settings,
}
SITES = tuple(HANDLERS)


POPUP_PATH = "__popup__/close"  # POST under any site: closes the interstitial and returns to `next`
NO_STORE = {"cache-control": "no-store"}  # perturbed pages: a back navigation asks the server again


@dataclasses.dataclass
class Reply:
  status: int = 200
  html: str = ""
  location: str = ""  # a redirect (303) when set


def respond(world: catalog.World, state: state_lib.SessionState, session: str, site: str, path: str,
            query: dict[str, str], form: dict[str, str], method: str = "GET") -> Reply:
  """One request of a session (its state mutated in place; the caller holds the store's lock)."""
  state.requests += 1
  ctx = Ctx(world=world, state=state, session=session, root=f"/s/{session}", path=path, query=query, form=form,
            method=method)
  pert = state.perturbation
  if method == "POST" and path.strip("/") == POPUP_PATH:
    state.popup_open = False
    nxt = form.get("next", "")
    return Reply(location=nxt if nxt.startswith(ctx.root + "/") else ctx.url(f"{site}/"))
  if method == "GET" and site != "launcher":
    state.page_gets += 1
    if pert.fails(state.page_gets):
      return Reply(html=_failure_page(ctx, site))
  out = HANDLERS[site](ctx)
  if out is None:
    body = page(ctx, site=site, title="Not found", body=f"<h1>Page not found</h1><p><a href='{ctx.url(site + '/')}'>"
                f"Back to the start page</a></p>")
    return Reply(status=404, html=body)
  if isinstance(out, Redirect):
    return Reply(location=out.location)
  if method == "GET" and site != "launcher":
    state.page_views += 1
    if pert.popup_view and state.page_views == pert.popup_view:
      state.popup_open = True
    if state.popup_open:
      return Reply(html=_popup_page(ctx, site))
  return Reply(html=out)


def _here(ctx: Ctx, site: str) -> str:
  return ctx.url(f"{site}/{ctx.path}", **ctx.query)


def _failure_page(ctx: Ctx, site: str) -> str:
  """P4: a transient server error; the same request succeeds when tried again (unless it fails again)."""
  body = (f"<div class=error id=failure><h1>Something went wrong</h1><p>We could not load this page. "
          f"Please try again.</p></div><p><a class=btn id=retry href='{esc(_here(ctx, site))}'>Try again</a></p>")
  return page(ctx, site=site, title="Something went wrong", body=body)


def _popup_page(ctx: Ctx, site: str) -> str:
  """P1: an interstitial that takes the whole screen until closed; its close button sits in a seeded corner."""
  corner = ctx.state.perturbation.popup_corner
  v, h = corner.split("-")
  close = (f"<form method=post action='{ctx.url(f'{site}/{POPUP_PATH}')}' style='position:fixed;{v}:12px;{h}:12px'>"
           f"<input type=hidden name=next value='{esc(_here(ctx, site))}'>"
           f"<button type=submit id=popup-close aria-label='Close'>Close ✕</button></form>")
  body = (f"<div class=notice id=popup role=dialog aria-label='Special offer'><h1>Enjoying the app?</h1>"
          f"<p>Sign up for our newsletter and get 10 % off your next order.</p>"
          f"<p><a id=popup-more href='{ctx.url(f'{site}/')}'>Learn more</a></p></div>{close}")
  return page(ctx, site=site, title="Special offer", body=body)


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
      reply = respond(world, state, session, site, path, dict(request.query_params),
                      {k: str(v) for k, v in form.items()}, request.method)
      headers = NO_STORE if state.perturbation.level else None
    if reply.location:
      return RedirectResponse(reply.location, status_code=303, headers=headers)
    return HTMLResponse(reply.html, status_code=reply.status, headers=headers)

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

  async def start_episode(request: Request) -> Response:
    session = request.path_params["session"]
    try:
      store.check_id(session)
      pert = perturb.Perturbation.from_json(json.loads(await request.body() or b"{}"))
    except (ValueError, TypeError) as e:
      return PlainTextResponse(str(e), status_code=400)
    store.start_episode(session, pert)
    return JSONResponse({"session": session, "perturbation": pert.to_json()})

  async def healthz(request: Request) -> Response:
    return PlainTextResponse(f"ok seed={seed} sessions={len(store)}")

  app = Starlette(routes=[
      Route("/healthz", healthz),
      Route("/__state__/{session}", session_state, methods=["GET", "DELETE"]),
      Route("/__episode__/{session}", start_episode, methods=["POST"]),
      Route("/s/{session}/{site}", site_root),
      Route("/s/{session}/{site}/{path:path}", site_page, methods=["GET", "POST"]),
  ])
  app.state.store = store
  app.state.world = world
  return app
