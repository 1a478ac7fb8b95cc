"""The page shell every bundled site shares: inline CSS, phone viewport, header and footer.

Pages are small server-rendered HTML with no scripts or external assets, so Chromium renders one in a few
milliseconds and a screenshot looks the same on every machine. One stylesheet serves desktop and phone: under
640 CSS px the sidebar stacks and tap targets grow (the device profile's phone layout).
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any, Iterable
from urllib.parse import urlencode

from jaxagent.envs.sites import catalog
from jaxagent.envs.sites import state as state_lib

CSS = """
*{box-sizing:border-box}body{margin:0;font:15px/1.4 system-ui,-apple-system,'DejaVu Sans',sans-serif;color:#1d2330;
background:#f5f6f8}a{color:#1a56c4;text-decoration:none}a:hover{text-decoration:underline}
header{background:#1f2a44;color:#fff;padding:8px 16px;display:flex;flex-wrap:wrap;gap:12px;align-items:center}
header a{color:#fff}.logo{font-weight:700;font-size:20px;margin-right:8px}
header form{display:flex;flex:1;min-width:180px;max-width:460px}header input[type=search]{flex:1;padding:6px 8px;
border:0;border-radius:4px 0 0 4px;font-size:15px}header button{padding:6px 12px;border:0;background:#f2b33d;
border-radius:0 4px 4px 0;font-size:15px}nav.cats{background:#fff;border-bottom:1px solid #dde;padding:6px 16px;
display:flex;flex-wrap:wrap;gap:14px}main{padding:16px;max-width:1100px;margin:0 auto}.layout{display:flex;gap:18px}
aside{width:190px;flex:none;background:#fff;border:1px solid #dde;border-radius:6px;padding:10px}
aside h3{margin:8px 0 4px;font-size:14px}aside ul{list-style:none;margin:0;padding:0}aside li{margin:2px 0}
.content{flex:1;min-width:0}.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px}
.card{background:#fff;border:1px solid #dde;border-radius:6px;padding:10px}.card .name{font-weight:600;display:block}
td>a{display:inline-block}
.price{color:#b3261e;font-weight:700}.muted{color:#667}.chips a,.chips span{display:inline-block;padding:3px 10px;
margin:2px;border:1px solid #99a;border-radius:14px}.chips .on{background:#1f2a44;color:#fff;border-color:#1f2a44}
table{border-collapse:collapse;background:#fff;width:100%}th,td{border:1px solid #dde;padding:6px 8px;text-align:left}
th{background:#eef0f4}.pager{margin:14px 0;display:flex;gap:8px;flex-wrap:wrap}.pager a,.pager span{padding:4px 10px;
border:1px solid #99a;border-radius:4px;background:#fff}.pager .cur{background:#1f2a44;color:#fff}
button,.btn{padding:8px 16px;border:0;border-radius:4px;background:#1a56c4;color:#fff;font-size:15px;cursor:pointer}
form.stack label{display:block;margin:10px 0 4px}form.stack input[type=text],form.stack textarea{width:100%;
max-width:420px;padding:7px;font-size:15px;border:1px solid #99a;border-radius:4px}
.notice{background:#fff4d6;border:1px solid #e5c06b;padding:8px 12px;border-radius:4px;margin-bottom:12px}
.error{background:#fde2e1;border:1px solid #e0908b;padding:8px 12px;border-radius:4px;margin-bottom:12px}
#cookie-banner{position:fixed;left:0;right:0;bottom:0;background:#263238;color:#fff;padding:12px 16px;display:flex;
gap:12px;align-items:center;flex-wrap:wrap;z-index:10}#cookie-banner p{margin:0;flex:1;min-width:200px}
.post{background:#fff;border:1px solid #dde;border-radius:6px;padding:10px;margin-bottom:10px}
.apps{display:grid;grid-template-columns:repeat(3,1fr);gap:22px;max-width:420px;margin:40px auto}
.app{display:flex;flex-direction:column;align-items:center;gap:6px;color:#fff}.app .icon{width:64px;height:64px;
border-radius:16px;display:flex;align-items:center;justify-content:center;font-size:28px;font-weight:700}
body.launcher{background:linear-gradient(#3a4a7a,#1f2a44);min-height:100vh}.clock{color:#fff;text-align:center;
font-size:44px;margin-top:30px}footer{color:#667;text-align:center;padding:20px;font-size:13px}
@media (max-width:640px){.layout{flex-direction:column}aside{width:auto}aside ul{display:flex;flex-wrap:wrap;
gap:4px 14px}header form{max-width:none;flex-basis:100%;order:3}
.grid{grid-template-columns:1fr}nav.cats{gap:10px;font-size:16px}th,td{padding:8px 6px}button,.btn{padding:11px 18px}
.chips a,.chips span{padding:7px 14px}main{padding:10px}}
"""


def esc(value: Any) -> str:
  return html.escape(str(value), quote=True)


@dataclasses.dataclass
class Ctx:
  """What a page handler sees: the world, this session's state, its URL root and the request's inputs."""

  world: catalog.World
  state: state_lib.SessionState
  session: str
  root: str  # "/s/<session>", the prefix of every link
  path: str  # the path inside the site, e.g. "p/12"
  query: dict[str, str]
  form: dict[str, str]
  method: str = "GET"

  def url(self, site_path: str, **params: Any) -> str:
    q = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{self.root}/{site_path}" + (f"?{urlencode(q)}" if q else "")


@dataclasses.dataclass
class Redirect:
  location: str


def page(ctx: Ctx, *, site: str, title: str, body: str, header: str = "", nav: str = "", extra: str = "") -> str:
  return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
          f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{esc(title)}</title>"
          f"<style>{CSS}</style></head><body class='{site}'>{header}{nav}<main>{body}</main>"
          f"<footer>jaxagent offline web · {esc(site)} · seed {ctx.world.seed}</footer>{extra}</body></html>")


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], table_id: str = "") -> str:
  """Cells are inserted as given (callers escape), so a cell may hold a link."""
  head = "".join(f"<th>{esc(h)}</th>" for h in headers)
  body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
  tid = f" id='{table_id}'" if table_id else ""
  return f"<table{tid}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def pager(ctx: Ctx, site_path: str, page_no: int, pages: int, params: dict[str, Any]) -> str:
  if pages <= 1:
    return ""
  parts = []
  if page_no > 1:
    parts.append(f"<a rel=prev href='{esc(ctx.url(site_path, **params, page=page_no - 1))}'>Previous</a>")
  for k in range(1, pages + 1):
    if k == page_no:
      parts.append(f"<span class=cur>{k}</span>")
    else:
      parts.append(f"<a href='{esc(ctx.url(site_path, **params, page=k))}'>{k}</a>")
  if page_no < pages:
    parts.append(f"<a rel=next href='{esc(ctx.url(site_path, **params, page=page_no + 1))}'>Next</a>")
  return f"<nav class=pager aria-label=Pagination>{''.join(parts)}</nav>"


def int_arg(value: str | None, default: int, lo: int = 1, hi: int = 10**6) -> int:
  try:
    return min(max(int(value), lo), hi) if value not in (None, "") else default
  except ValueError:
    return default
