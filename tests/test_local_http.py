"""`local_http.get` against a real local HTTP server: the body comes back, an error status raises, and every call
shares one TLS context."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest

from jaxagent import local_http


class _Handler(http.server.BaseHTTPRequestHandler):

  def do_GET(self):  # pylint: disable=invalid-name
    status = 200 if self.path == "/healthz" else 404
    body = b"ok seed=3" if status == 200 else b"no such page"
    self.send_response(status)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):
    pass


@pytest.fixture(name="base_url")
def _base_url():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}"
  server.shutdown()
  server.server_close()


def test_get_returns_the_body_and_refuses_an_error_status(base_url):
  assert local_http.get(f"{base_url}/healthz", timeout=5).text == "ok seed=3"
  with pytest.raises(httpx.HTTPStatusError):
    local_http.get(f"{base_url}/missing", timeout=5)


def test_every_call_shares_one_verified_tls_context(base_url):
  local_http.get(f"{base_url}/healthz", timeout=5)
  context = local_http._tls()  # pylint: disable=protected-access
  local_http.get(f"{base_url}/healthz", timeout=5)
  assert local_http._tls() is context  # pylint: disable=protected-access
  assert context.verify_mode.name == "CERT_REQUIRED" and context.check_hostname
