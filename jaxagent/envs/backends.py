"""`make_pool`: the env pool `config.env` asks for, of the backends in `BACKENDS`.

Above both backends (`pool.EnvPool` on this machine, `ray_pool.RayEnvPool` on a Ray cluster) so that neither
imports the other's module to pick one: `ray_pool` builds on `pool`, and this module on both.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxagent.envs import pool

BACKENDS = ("subprocess", "ray")


def make_pool(spec: Mapping[str, Any], env_config, num_workers: int | None = None) -> pool.EnvPool:
  """The pool `config.env` asks for: `backend` "subprocess" (an `EnvPool` on this machine, the default, also
  for configs written before the key existed) or "ray" (a `RayEnvPool` on the Ray cluster at `ray_address`).
  `num_workers` defaults to `env_config.workers`."""
  backend = env_config.get("backend", "subprocess")
  kwargs = dict(num_workers=int(env_config.workers if num_workers is None else num_workers),
                step_timeout=float(env_config.step_timeout), reset_timeout=float(env_config.reset_timeout))
  if backend == "subprocess":
    return pool.EnvPool(spec, **kwargs)
  if backend == "ray":
    from jaxagent.envs import ray_pool  # pylint: disable=g-import-not-at-top  # Ray is an optional extra
    return ray_pool.RayEnvPool(spec, address=str(env_config.get("ray_address", "")), **kwargs)
  raise ValueError(f"config.env.backend={backend!r} is unknown; allowed: {list(BACKENDS)} (set "
                   "--config.env.backend=ray and --config.env.ray_address=ray://HEAD:10001 for a Ray fleet)")
