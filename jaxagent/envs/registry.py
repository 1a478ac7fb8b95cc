"""Environments built from picklable specs, so a worker subprocess can build its own copy.

A spec is a plain dict `{"kind": <name or "module:Class">, **constructor kwargs}`. Backends are imported
lazily: asking for a MiniWoB env never imports the Android one. `register` plugs a new backend in; since a
spawned worker does not see the parent's registrations, `resolve` rewrites a spec's kind to its
`"module:Class"` target before the spec crosses a process boundary.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from jaxagent import types

_BACKENDS: dict[str, str] = {
    "browser": "jaxagent.envs.browser:BrowserEnv",
    "miniwob": "jaxagent.envs.miniwob:MiniWoBEnv",
}


def register(kind: str, target: str) -> None:
  """Makes `{"kind": kind, ...}` build `target` ("package.module:ClassOrFactory")."""
  if ":" not in target:
    raise ValueError(f"register({kind!r}, {target!r}): target must read 'package.module:Class'")
  _BACKENDS[kind] = target


def kinds() -> list[str]:
  return sorted(_BACKENDS)


def resolve(spec: Mapping[str, Any]) -> dict[str, Any]:
  """The same spec with `kind` replaced by its "module:Class" target (safe to send to another process)."""
  if not isinstance(spec, Mapping) or "kind" not in spec:
    raise ValueError(f"env spec {spec!r} needs a 'kind' key; valid kinds: {kinds()} or 'package.module:Class'")
  kind = spec["kind"]
  if ":" in kind:
    target = kind
  elif kind in _BACKENDS:
    target = _BACKENDS[kind]
  else:
    raise ValueError(f"env spec kind={kind!r} is unknown; valid kinds: {kinds()}, or a 'package.module:Class' "
                     "target, or call jaxagent.envs.registry.register(kind, 'module:Class') first")
  return {**spec, "kind": target}


def load(target: str) -> Any:
  module_name, _, attr = target.partition(":")
  try:
    obj = importlib.import_module(module_name)
  except ImportError as e:
    raise ImportError(f"env backend {target!r}: cannot import module {module_name!r}: {e}") from e
  for name in attr.split("."):
    try:
      obj = getattr(obj, name)
    except AttributeError:
      raise ImportError(f"env backend {target!r}: module {module_name!r} has no attribute {attr!r}") from None
  return obj


def make_env(spec: Mapping[str, Any]) -> types.Env:
  """Builds the environment a spec names: `make_env({"kind": "miniwob", "headless": True})`."""
  spec = resolve(spec)
  kwargs = {k: v for k, v in spec.items() if k != "kind"}
  return load(spec["kind"])(**kwargs)
