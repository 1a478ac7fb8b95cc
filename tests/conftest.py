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
# The subprocesses the tests start (`python -m jaxagent.main`, launchers) import this checkout's package, not
# whichever one an editable install points at: a fresh clone tests its own code, and runs without an install.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and os.path.abspath(p) != ROOT])


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


import pytest  # noqa: E402  (after the environment above, before any test imports JAX)


@pytest.fixture(scope="session")
def smollm2_cut(tmp_path_factory):
  """SmolLM2-135M-Instruct cut to its first two layers (embeddings, final norm, tokenizer and chat template kept):
  a real pretrained decoder's shapes and tokenizer, in which the `:smollm` variants run end to end in a smoke's
  time. Needs the checkpoint (`scripts/setup.sh test` fetches it)."""
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import gguf  # pylint: disable=g-import-not-at-top
  src, layers = gguf.smollm2_hf_dir(), 2
  out = tmp_path_factory.mktemp("smollm2_cut")
  for name in os.listdir(src):
    if name not in ("model.safetensors", "config.json"):
      shutil.copy(os.path.join(src, name), out / name)
  with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  (out / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=layers), indent=2))
  kept = {k: v for k, v in load_file(os.path.join(src, "model.safetensors")).items()
          if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
  save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
  return str(out)
