"""Fault injections against the origin allowlist: a real page on an allowed origin tries every way we know to
reach origins it may not (redirect hops, WebSockets, speculation rules, preconnects, service workers, userinfo
and wildcard-port URLs, ...), and real servers on the forbidden origins count every TCP connection they get."""

import http.server
import socket
import threading
import time

import pytest

from jaxagent.envs import egress
from jaxagent.envs.browser import BrowserEnv
from jaxagent.types import Action, ActionKind, Task


class _Counter:
  """A TCP server that counts accepted connections and answers each with a small HTML page (or a 101 to a
  WebSocket handshake), so an escape is visible both as a connection and as loaded content."""

  def __init__(self, host: str):
    self.sock = socket.socket()
    self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self.sock.bind((host, 0))
    self.sock.listen(64)
    self.host, self.port = host, self.sock.getsockname()[1]
    self.origin = f"http://{host}:{self.port}"
    self.connections = 0
    self.requests: list[str] = []
    threading.Thread(target=self._serve, daemon=True).start()

  def _serve(self):
    while True:
      try:
        conn, _ = self.sock.accept()
      except OSError:
        return
      self.connections += 1
      threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

  def _answer(self, conn):
    try:
      conn.settimeout(2)
      head = conn.recv(65536).decode("latin-1")
      if head:
        self.requests.append(head.split("\r\n", 1)[0])
      body = b"<html><title>FORBIDDEN</title><body>escaped</body></html>"
      conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nAccess-Control-Allow-Origin: *\r\n"
                   b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    except OSError:
      pass
    finally:
      conn.close()

  def close(self):
    self.sock.close()


def _pages(bad: str, bad_other_host: str) -> dict[str, tuple[int, dict, str]]:
  """path -> (status, headers, body) of the allowed site; `bad` is a forbidden origin."""
  html = lambda body: (200, {"Content-Type": "text/html"}, f"<html><title>ok</title><body>{body}</body></html>")
  return {
      "/": html("<a id=go href='/next'>next</a>"),
      "/next": html("next page"),
      "/redirect": (302, {"Location": f"{bad}/landing"}, ""),
      "/redirect_chain": (302, {"Location": "/redirect"}, ""),
      "/link": html(f"<a id=go href='{bad}/x'>away</a>"),
      "/link_redirect": html("<a id=go href='/redirect'>away</a>"),
      "/img_redirect": html("<img src='/redirect'>"),
      "/fetch_redirect": html("<script>fetch('/redirect').catch(() => 0)</script>"),
      "/fetch": html(f"<script>fetch('{bad}/f', {{mode: 'no-cors'}}).catch(() => 0)</script>"),
      "/beacon": html(f"<script>navigator.sendBeacon('{bad}/b', 'x')</script>"),
      "/websocket": html(f"<script>try {{ new WebSocket('{bad.replace('http', 'ws')}/ws'); }} catch (e) {{}}</script>"),
      "/prefetch": html(f"<script type=speculationrules>{{\"prefetch\": [{{\"source\": \"list\", \"urls\": "
                        f"[\"{bad}/pf\"]}}]}}</script>"),
      "/prerender": html(f"<script type=speculationrules>{{\"prerender\": [{{\"source\": \"list\", \"urls\": "
                         f"[\"{bad}/pr\"]}}]}}</script>"),
      "/preconnect": html(f"<link rel=preconnect href='{bad}'><link rel=dns-prefetch href='{bad}'>"),
      "/prefetch_link": html(f"<link rel=prefetch href='{bad}/lp'>"),
      "/iframe": html(f"<iframe src='{bad}/i'></iframe>"),
      "/form": html(f"<form id=f method=post action='{bad}/post'><input name=a value=1></form>"
                    "<script>document.getElementById('f').submit()</script>"),
      "/meta_refresh": (200, {"Content-Type": "text/html"},
                        f"<html><head><meta http-equiv=refresh content='0; url={bad}/m'></head></html>"),
      "/location": html(f"<script>location.href = '{bad}/l'</script>"),
      "/window_open": html(f"<script>window.open('{bad}/w')</script>"),
      "/userinfo_link": html(f"<a id=go href='{bad_other_host}'>away</a>"),
      "/sw": html("<script>navigator.serviceWorker && navigator.serviceWorker.register('/sw.js')"
                  ".then(() => navigator.serviceWorker.ready).then(() => fetch('/via_sw')).catch(() => 0)</script>"),
      "/sw.js": (200, {"Content-Type": "text/javascript"},
                 f"self.addEventListener('install', () => self.skipWaiting());"
                 f"self.addEventListener('activate', (e) => e.waitUntil(clients.claim()));"
                 f"self.addEventListener('fetch', (e) => {{ if (e.request.url.endsWith('/via_sw'))"
                 f" e.respondWith(fetch('{bad}/sw', {{mode: 'no-cors'}})); }});"),
      "/speculate_here": html("<script type=speculationrules>{\"prefetch\": [{\"source\": \"list\", \"urls\": "
                              "[\"/next?pf\"]}], \"prerender\": [{\"source\": \"list\", \"urls\": [\"/next?pr\"]}]}"
                              "</script><link rel=prefetch href='/next?lp'><a id=go href='/next?pf'>next</a>"),
      "/event_source": html(f"<script>new EventSource('{bad}/es')</script>"),
  }


@pytest.fixture(scope="module")
def world():
  """An allowed site on 127.0.0.1, a forbidden port on the same host and a forbidden host (127.0.0.2)."""
  same_host = _Counter("127.0.0.1")
  other_host = _Counter("127.0.0.2")
  state = {"hits": []}

  class Handler(http.server.BaseHTTPRequestHandler):
    def _reply(self):
      state["hits"].append(self.path)
      status, headers, body = state["pages"].get(self.path.split("?")[0], (404, {}, "no"))
      self.send_response(status)
      for k, v in headers.items():
        self.send_header(k, v)
      data = body.encode()
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    do_GET = do_POST = _reply

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  site = f"http://127.0.0.1:{server.server_address[1]}"
  # The userinfo trick: `http://127.0.0.1:1@127.0.0.2:P/` is host 127.0.0.2 to the browser.
  state["pages"] = _pages(same_host.origin, f"http://127.0.0.1:1@127.0.0.2:{other_host.port}/u")
  yield {"site": site, "same_host": same_host, "other_host": other_host, "hits": state["hits"]}
  server.shutdown()
  same_host.close()
  other_host.close()


@pytest.fixture(scope="module")
def env():
  e = BrowserEnv(observation="som")
  yield e
  e.close()


ESCAPES = ["redirect", "redirect_chain", "link", "link_redirect", "img_redirect", "fetch_redirect", "fetch",
           "beacon", "websocket", "prefetch", "prerender", "preconnect", "prefetch_link", "iframe", "form",
           "meta_refresh", "location", "window_open", "sw", "event_source"]

NAVIGATIONS = ["redirect", "form", "meta_refresh", "location", "window_open"]


def _task(world, page, origins=None):
  return Task(id=page, intent="stay", site="fixture", start_url=f"{world['site']}/{page}",
              allowed_origins=tuple(origins or (world["site"],)))


def _connections(world):
  return world["same_host"].connections + world["other_host"].connections


def _quiet(env, seconds=1.0):
  """Lets the page's own timers, speculative loads and workers run."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    env.page.wait_for_timeout(50)


@pytest.mark.parametrize("page", ESCAPES)
@pytest.mark.slow
def test_no_page_reaches_a_forbidden_origin(env, world, page):
  before = _connections(world)
  first = env.reset(_task(world, page))
  _quiet(env)
  obs, _, _, info = env.step(Action(ActionKind.WAIT))
  assert _connections(world) == before, f"{page}: {world['same_host'].requests + world['other_host'].requests}"
  if page in NAVIGATIONS:  # a document the page asked for is blocked and reported (a new window's too)
    assert "was blocked" in first.error + obs.error, (first.error, obs.error, info["blocked"])
  assert "FORBIDDEN" not in obs.title and "escaped" not in obs.element_text
  assert egress.allowed(env.page.url, (world["site"],)) or env.page.url.startswith("about:")


@pytest.mark.slow
def test_a_redirect_hop_to_a_forbidden_origin_is_blocked_and_reported(env, world):
  env.reset(_task(world, "link_redirect"))
  before = _connections(world)
  obs, _, _, info = env.step(Action(ActionKind.CLICK, element=0))
  assert _connections(world) == before
  assert obs.url.startswith(world["site"])
  assert any(world["same_host"].origin in u for u in info["blocked"]), info
  assert "was blocked" in obs.error


@pytest.mark.slow
def test_userinfo_and_port_wildcard_tricks_are_refused(env, world):
  pattern = "http://127.0.0.1:*"  # any port of the allowed host: 127.0.0.2 stays forbidden
  before = _connections(world)
  env.reset(_task(world, "userinfo_link", origins=(pattern,)))
  obs, _, _, info = env.step(Action(ActionKind.CLICK, element=0))
  obs, _, _, info2 = env.step(Action(ActionKind.GOTO, url=f"http://127.0.0.1:1@127.0.0.2:{world['other_host'].port}/"))
  assert world["other_host"].connections == 0 and _connections(world) == before
  assert info["blocked"] and info2["blocked"]
  assert obs.url.startswith("http://127.0.0.1:")


@pytest.mark.slow
def test_no_speculative_load_reaches_even_an_allowed_server(env, world):
  """Speculation rules and `<link rel=prefetch>` on the page's own origin: the server sees only what the agent
  opens (a prefetched or prerendered page could change a site's state), and the real navigation still loads."""
  world["hits"].clear()
  env.reset(_task(world, "speculate_here"))
  _quiet(env)
  assert world["hits"] == ["/speculate_here"]
  obs, _, _, info = env.step(Action(ActionKind.CLICK, element=0))
  assert obs.url.endswith("/next?pf") and obs.title == "ok" and not info["blocked"]
  assert world["hits"][-1] == "/next?pf"


@pytest.mark.parametrize("url, patterns, ok", [
    ("http://127.0.0.1:8000/a", ("http://127.0.0.1:8000",), True),
    ("http://127.0.0.1:8001/a", ("http://127.0.0.1:8000",), False),
    ("http://127.0.0.1:8001/a", ("http://127.0.0.1:*",), True),
    ("http://127.0.0.1/a", ("http://127.0.0.1:80",), True),  # the scheme's default port
    ("http://127.0.0.1:1@evil.com/", ("http://127.0.0.1:*",), False),  # userinfo: the host is evil.com
    ("http://user@127.0.0.1:8000/", ("http://127.0.0.1:8000",), False),  # userinfo is refused outright
    ("http://127.0.0.1:80x/", ("http://127.0.0.1:*",), False),
    ("http://127.0.0.1.evil.com:8000/", ("http://127.0.0.1:*",), False),
    ("http://a.example.com/", ("http://*.example.com",), True),
    ("http://a.example.com.evil.org/", ("http://*.example.com",), False),
    ("https://127.0.0.1:8000/", ("http://127.0.0.1:8000",), False),  # another scheme is another origin
    ("ws://127.0.0.1:8000/s", ("http://127.0.0.1:8000",), True),  # the same server's WebSocket
    ("data:text/html,hi", ("http://127.0.0.1:8000",), True),
    ("file:///etc/passwd", ("http://127.0.0.1:8000",), False),
])
@pytest.mark.slow
def test_allowed_matches_origins_exactly(url, patterns, ok):
  assert egress.allowed(url, patterns) is ok
