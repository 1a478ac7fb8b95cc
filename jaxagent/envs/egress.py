"""Where a browser may connect: origin matching and a loopback egress proxy that enforces it.

Playwright's request routing sees neither a redirect's later hops nor WebSockets, service workers, speculative
prefetch/prerender or preconnects, and a refused navigation can still have opened a TCP connection. So each
`BrowserEnv` context sends all its traffic, loopback included, through an `EgressProxy`: Chromium connects to
nothing but the proxy, and the proxy opens a connection upstream only for an allowed origin. Every refusal is
recorded, and the env reports it in the step's info. (Inside a TLS tunnel only the host and port are seen.)

Origins are `scheme://host[:port]`; an allowlist entry may use `*` in the host (`*` covers DNS labels, never
`@`, `:` or `/`) or as the whole port (digits only). URLs with userinfo (`http://a:1@b/`) are refused outright:
their host is the part after `@`, which is what the trick relies on. `ws`/`wss` match `http`/`https` (the same
server); `data:`, `blob:` and `about:` are content the page already holds; `file:` URLs need the entry `file://`.
"""

from __future__ import annotations

import logging
import re
import select
import socket
import socketserver
import threading
import urllib.parse
from typing import Callable, Iterable

log = logging.getLogger(__name__)

LOCAL_SCHEMES = ("data:", "blob:", "about:")
FILES = "file://"  # the allowlist entry that admits local files (a task whose pages are files)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_SAME_SERVER = {"ws": "http", "wss": "https"}
_PATTERN = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>[a-z0-9.*-]+|\[[0-9a-f:.]+\])(?::(?P<port>\d+|\*))?/?$")


def _pattern_regex(pattern: str) -> re.Pattern:
  m = _PATTERN.match(pattern.strip().lower())
  if m is None:
    raise ValueError(f"allowed origin {pattern!r} is not scheme://host[:port] (`*` may stand for host labels "
                     "or the whole port)")
  scheme, host, port = m["scheme"], m["host"], m["port"]
  host_re = re.escape(host).replace(r"\*", "[a-z0-9-]+(?:\\.[a-z0-9-]+)*")
  if port == "*":
    port_re = r"\d+"
  else:
    port_re = re.escape(port or str(_DEFAULT_PORTS.get(scheme, "")))
  return re.compile(f"^{re.escape(scheme)}://{host_re}:{port_re}$")


_CACHE: dict[tuple[str, ...], list[re.Pattern]] = {}


def _patterns(origins: Iterable[str]) -> list[re.Pattern]:
  key = tuple(origins)
  if key not in _CACHE:
    _CACHE[key] = [_pattern_regex(o) for o in key if o != FILES]
  return _CACHE[key]


def canonical_origin(url: str) -> str | None:
  """`scheme://host:port` with the scheme's default port made explicit; None for a URL with userinfo, a bad
  port or no host (never allowed)."""
  try:
    p = urllib.parse.urlsplit(url.strip())
    port = p.port
  except ValueError:
    return None
  if "@" in p.netloc or not p.hostname:
    return None
  scheme = _SAME_SERVER.get(p.scheme.lower(), p.scheme.lower())
  port = port if port is not None else _DEFAULT_PORTS.get(scheme)
  if port is None:
    return None
  host = p.hostname.lower()
  if ":" in host:
    host = f"[{host}]"
  return f"{scheme}://{host}:{port}"


def allowed(url: str, origins: Iterable[str]) -> bool:
  """Whether `url` is on one of `origins` (see the module docstring for the matching rules)."""
  if url.startswith(LOCAL_SCHEMES):
    return True
  if url.lower().startswith("file:"):
    return FILES in tuple(origins)
  origin = canonical_origin(url)
  return origin is not None and any(p.match(origin) for p in _patterns(origins))


def allowed_hostport(host: str, port: int, origins: Iterable[str]) -> bool:
  """Whether a tunnel (CONNECT, as WebSockets and TLS use) to host:port may open: some allowed origin, of any
  web scheme, is that host and port."""
  host = host.lower()
  if ":" in host and not host.startswith("["):
    host = f"[{host}]"
  return any(p.match(f"{scheme}://{host}:{port}") for p in _patterns(origins) for scheme in ("http", "https"))


def validate_origins(origins: Iterable[str]) -> None:
  """Raises a ValueError naming the first entry that is not an origin pattern."""
  _patterns(origins)


# ------------------------------------------------------------------------------------------- the proxy

_HEAD_LIMIT = 256 * 1024
_HOP_HEADERS = ("proxy-connection", "proxy-authorization", "connection", "keep-alive")


class EgressProxy:
  """An HTTP forward proxy on 127.0.0.1 that forwards only to allowed origins.

  `origins` is read at every request, so one proxy serves one env across its tasks (`set_origins` per
  context). A refused plain request is answered `204 No Content` (a navigation then stays where it was; a
  sub-resource is empty); a refused tunnel `403` (the WebSocket or TLS connection fails). Speculative loads
  (`Sec-Purpose: prefetch[;prerender]`) are answered 503 whatever their origin: speculative loading is off in
  effect, and no server sees a page the agent did not open. Each connection carries one request
  (`Connection: close` upstream), so every request is checked.
  """

  def __init__(self, on_refused: Callable[[str], None] | None = None):
    self._origins: tuple[str, ...] = ()
    self._lock = threading.Lock()
    self._on_refused = on_refused
    self.refused: list[str] = []
    self.speculative = 0  # speculative loads answered 503
    proxy = self

    class Handler(socketserver.BaseRequestHandler):
      def handle(self):
        proxy._handle(self.request)

    class Server(socketserver.ThreadingTCPServer):
      daemon_threads = True
      allow_reuse_address = True
      request_queue_size = 128

    self._server = Server(("127.0.0.1", 0), Handler)
    self.port = self._server.server_address[1]
    self.url = f"http://127.0.0.1:{self.port}"
    self._thread = threading.Thread(target=self._server.serve_forever, name="egress-proxy", daemon=True)
    self._thread.start()

  def set_origins(self, origins: Iterable[str]) -> None:
    origins = tuple(origins)
    validate_origins(origins)
    with self._lock:
      self._origins = origins

  def take_refused(self) -> list[str]:
    """The refusals since the last call."""
    with self._lock:
      out, self.refused = self.refused, []
    return out

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()

  def _refuse(self, what: str) -> None:
    with self._lock:
      self.refused.append(what)
    log.info("egress refused: %s", what)
    if self._on_refused is not None:
      self._on_refused(what)

  def _handle(self, client: socket.socket) -> None:
    client.settimeout(30)
    try:
      head = _read_head(client)
      if head is None:
        return
      head_bytes, rest = head
      lines = head_bytes.decode("latin-1").split("\r\n")
      method, target, version = (lines[0].split(" ") + ["", ""])[:3]
      with self._lock:
        origins = self._origins
      if method.upper() == "CONNECT":
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        if not port.isdigit() or not allowed_hostport(host, int(port), origins):
          self._refuse(f"CONNECT {target}")
          client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
          return
        upstream = socket.create_connection((host, int(port)), timeout=30)
        client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        _pipe(client, upstream, rest)
        return
      if not allowed(target, origins) or not target.lower().startswith("http://"):
        self._refuse(target)
        client.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return
      if any(_is_speculative(line) for line in lines[1:]):
        with self._lock:
          self.speculative += 1
        # Not 204: a 2xx prefetch would be kept and answer the real navigation later; a non-2xx one is dropped.
        client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nCache-Control: no-store\r\nContent-Length: 0\r\n"
                       b"Connection: close\r\n\r\n")
        return
      p = urllib.parse.urlsplit(target)
      path = urllib.parse.urlunsplit(("", "", p.path or "/", p.query, ""))
      upgrade = any(line.lower().startswith("upgrade:") for line in lines[1:])
      headers = [line for line in lines[1:] if line and (upgrade and line.lower().startswith("connection:")
                                                          or line.split(":", 1)[0].strip().lower() not in _HOP_HEADERS)]
      if not upgrade:
        headers.append("Connection: close")
      upstream = socket.create_connection((p.hostname, p.port or 80), timeout=30)
      upstream.sendall(("\r\n".join([f"{method} {path} {version}", *headers]) + "\r\n\r\n").encode("latin-1"))
      _pipe(client, upstream, rest)
    except OSError:
      pass
    finally:
      try:
        client.close()
      except OSError:
        pass


def _is_speculative(header_line: str) -> bool:
  """`Sec-Purpose: prefetch[;prerender]` (speculation rules, `<link rel=prefetch>`) or the older `Purpose:`."""
  name, _, value = header_line.partition(":")
  return name.strip().lower() in ("sec-purpose", "purpose") and "prefetch" in value.lower()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes] | None:
  data = b""
  while b"\r\n\r\n" not in data:
    chunk = sock.recv(65536)
    if not chunk:
      return None
    data += chunk
    if len(data) > _HEAD_LIMIT:
      return None
  head, _, rest = data.partition(b"\r\n\r\n")
  return head, rest


def _pipe(client: socket.socket, upstream: socket.socket, pending: bytes) -> None:
  """Copies bytes both ways until either side closes."""
  try:
    if pending:
      upstream.sendall(pending)
    socks = [client, upstream]
    while True:
      readable, _, _ = select.select(socks, [], [], 60)
      if not readable:
        return
      for s in readable:
        data = s.recv(65536)
        if not data:
          return
        (upstream if s is client else client).sendall(data)
  except OSError:
    pass
  finally:
    upstream.close()
