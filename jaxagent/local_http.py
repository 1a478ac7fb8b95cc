"""Requests to the project's own HTTP servers, made at every episode (the bundled sites' `/healthz` when a task
is bound, `/__episode__` when it is perturbed, `/__state__` when it is judged).

`httpx.get` builds a new TLS context for every call, loading the system's CA bundle (~0.1 s of CPU on the 2-core
machine, a tenth of a reset) even for an `http://` URL; here one verified context per process serves them all.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
  return ssl.create_default_context()


def get(url: str, timeout: float) -> httpx.Response:
  """`url`'s response; an HTTP error status raises `httpx.HTTPStatusError`."""
  response = httpx.get(url, timeout=timeout, verify=_tls())
  response.raise_for_status()
  return response


def post(url: str, timeout: float, **kwargs) -> httpx.Response:
  """`httpx.post` with the shared context; an HTTP error status raises `httpx.HTTPStatusError`."""
  response = httpx.post(url, timeout=timeout, verify=_tls(), **kwargs)
  response.raise_for_status()
  return response
