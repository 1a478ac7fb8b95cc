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
