"""Test set-up: 8 simulated CPU devices (sharding tests) and no network, before JAX starts a backend."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the whole run and the subprocesses its end-to-end tests start: the
# recipes' tiny models compile the same executables again and again (the cache changes no numerics).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "jaxagent",
                                                                "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_collection_modifyitems(config, items):
  """Modules holding slow tests run first, the multi-stage end-to-end ones (launchers, recipes) before the rest;
  a stable sort, so each module keeps its own order. With one pytest-xdist worker per core each module goes to
  one worker in this order, so the long ones start at once and the short ones fill in behind them, instead of a
  long module starting last and running alone (longest first)."""
  del config
  module = lambda item: item.nodeid.split("::")[0]
  slow = {module(item) for item in items if item.get_closest_marker("slow")}
  end_to_end = ("tests/launch/", "tests/recipes/")
  items.sort(key=lambda item: 2 if module(item) not in slow else 0 if module(item).startswith(end_to_end) else 1)
