"""Entry point: `python -m jaxagent.main --config=configs/il.py[:variant] --workdir=DIR [--config.a.b=v ...]`.

Parses the config (ml_collections `config_flags`), optionally joins a multi-host job, writes the resolved
config (`config.json`) and what runs it (`provenance.json`: commit, package versions, machine) to the workdir
and hands over to the recipe named by `config.recipe`.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import itertools
import os
import sys
import threading
import warnings
from typing import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/<recipe>.py[:variant]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: resolved config, checkpoints, TensorBoard, profiles.")
_STOP_AFTER = flags.DEFINE_string("stop_after", "", "End the run once this stage is done (e.g. sft: a recipe's "
                                   "start alone); one seed, no --seeds.")
_SEEDS = flags.DEFINE_string("seeds", "", "Global seeds, e.g. 0,1,2: the whole recipe once per seed in "
                             "<workdir>/seed<k>/ (config.seed = k), their results combined in <workdir>/results.json")


def flat_keys(cfg, prefix: str = "") -> list[str]:
  """Every key path of a (nested) ConfigDict, e.g. `optim.lr`."""
  keys = []
  for k, v in cfg.items():
    path = f"{prefix}{k}"
    keys.append(path)
    if hasattr(v, "items") and hasattr(v, "get_ref"):
      keys.extend(flat_keys(v, path + "."))
  return keys


def load_config_file(spec: str, overrides: Sequence[str] = ()):
  """`get_config(arg)` of `path.py[:arg]`, loaded the way config_flags does, then `overrides` (a tool's
  `--config.a.b=value` arguments, each cast to its field's type; `main` itself has config_flags parse them)."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_jaxagent_config", path)
  if module_spec is None:
    raise FileNotFoundError(f"--config={spec}: no such config file {path!r}")
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg or None)
  for item in overrides:
    apply_override(config, item)
  return config


def apply_override(config, item: str) -> None:
  """`--config.a.b=value` on `config`, the value cast to the field's type (a bool from true/false/1/0/yes, any
  string for a field that is None); a SystemExit naming the argument for a malformed one or an unknown field."""
  if not item.startswith("--config.") or "=" not in item:
    raise SystemExit(f"{item!r}: overrides look like --config.critic.train.steps=800")
  path, value = item[len("--config."):].split("=", 1)
  *parents, leaf = path.split(".")
  node = config
  for name in parents:
    if name not in node:
      raise SystemExit(f"{item!r}: the config has no field {path!r}")
    node = node[name]
  if leaf not in node:
    raise SystemExit(f"{item!r}: the config has no field {path!r}")
  old = node[leaf]
  try:
    node[leaf] = ((value.lower() in ("1", "true", "yes")) if isinstance(old, bool) else
                  value if old is None else type(old)(value))
  except (ValueError, TypeError):
    raise SystemExit(f"{item!r}: expected {_EXPECTED.get(type(old).__name__, f'a {type(old).__name__} value')}"
                     ) from None


def check_overrides(argv: list[str]) -> None:
  """Fails on an override of a key the config does not have, naming the nearest valid keys."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv if a.startswith("--config.")]
  if spec is None or not overrides:
    return
  valid = flat_keys(load_config_file(spec))
  for key in overrides:
    if key not in valid:
      near = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
      hint = f"did you mean {', '.join('--config.' + n for n in near)}?" if near else "no similar key"
      raise app.UsageError(f"--config.{key}: {spec} has no key {key!r}; {hint}")


# What an override's parser (by its `flag_type()`, from the config's value there) accepts, for the error.
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false (or 1 / 0)",
             "tuple": "a tuple, e.g. '(1, 2)'"}


def bad_override(argv: list[str], flag_values=flags.FLAGS) -> str | None:
  """`--config.KEY='VALUE': expected ...` for the first override whose value its key's type refuses; None if
  none does. Runs after a failed parse, when the config's override flags are registered."""
  for arg in argv:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    name, value = arg[2:].split("=", 1)
    if name not in flag_values:
      continue
    parser = flag_values[name].parser
    try:
      parser.parse(value)
    except (ValueError, TypeError, SyntaxError):
      kind = parser.flag_type()
      return f"--{name}={value!r}: expected {_EXPECTED.get(kind, f'a {kind} value')}"
  return None


def _parse_flags(argv):
  try:
    check_overrides(argv)
  except app.UsageError as e:
    sys.exit(f"FATAL Flags parsing error: {e}")
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:  # a bad value, a flag without one, an unknown flag
    print(f"error: {bad_override(argv) or e}", file=sys.stderr)
    sys.exit(2)  # a usage error, as argparse exits


def coordinator_bind_address(environ=os.environ) -> str | None:
  """Where process 0's coordinator service listens. JAX binds every interface (`[::]:port`) unless told; here it
  binds the address the job names (`JAX_COORDINATOR_ADDRESS`: loopback for `launch.local`, process 0's own address
  on a cluster), or `JAXAGENT_COORDINATOR_BIND` when set; None (JAX's choice) only when nothing names one."""
  if environ.get("JAXAGENT_COORDINATOR_BIND"):
    return environ["JAXAGENT_COORDINATOR_BIND"]
  return environ.get("JAX_COORDINATOR_ADDRESS") or None


def init_distributed() -> None:
  """Joins the multi-host job. JAX auto-detects SLURM, Cloud TPU, Open MPI and k8s; elsewhere (e.g.
  `launch.local`) JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID say where this process stands."""
  import jax  # pylint: disable=g-import-not-at-top
  kwargs = {}
  if "JAX_NUM_PROCESSES" in os.environ:
    kwargs = dict(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                  process_id=int(os.environ["JAX_PROCESS_ID"]))
  bind = coordinator_bind_address()
  if not bind and "JAX_COORDINATOR_BIND_ADDRESS" not in os.environ:  # JAX reads that one itself
    bind = _slurm_coordinator_address()
  if bind:
    kwargs["coordinator_bind_address"] = bind
  jax.distributed.initialize(**kwargs)


def _slurm_coordinator_address() -> str | None:
  """Under SLURM (when JAX's auto-detection will pick it), the address JAX derives for the coordinator: the
  step's first node, where task 0 runs, on the port from the job id (or JAX_COORDINATOR_PORT). Process 0's
  coordinator binds that name, not JAX's default of every interface (`[::]:port`). None elsewhere."""
  try:
    from jax._src import clusters  # pylint: disable=g-import-not-at-top  # JAX's own detection, same answer
    slurm = clusters.SlurmCluster
  except (ImportError, AttributeError):
    return None
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access  # JAX's order
    if env is slurm:
      break
    if not env.opt_in_only_method and env.is_env_present():
      return None  # JAX takes that environment (Open MPI) first
  if not slurm.is_env_present():
    return None
  return slurm.get_coordinator_address(timeout_secs=None,
                                       override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT"))


def use_compilation_cache(environ=os.environ) -> str | None:
  """Turns on JAX's persistent compilation cache for the run, in JAX_COMPILATION_CACHE_DIR if set, else
  `~/.cache/jaxagent/xla` (`$XDG_CACHE_HOME` honoured), for programs that take ≥ 0.2 s to compile unless
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise. Stages reload the same models (each policy's
  sampler, each training's step), `--seeds` and reruns compile the same programs again: from the cache they load,
  with the same numerics. JAX_ENABLE_COMPILATION_CACHE=false turns it off (returns None)."""
  import jax  # pylint: disable=g-import-not-at-top
  if environ.get("JAX_ENABLE_COMPILATION_CACHE", "").lower() in ("0", "false", "no"):
    return None
  path = environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
      environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "jaxagent", "xla")
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  return path


_JAX_CACHE_WRITE_ARGS = ("cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks")


def jax_cache_writer():
  """(JAX's compiler module, its cache writer, the function that stores an entry) when this JAX has them as
  `write_cache_from_every_process` expects; else None."""
  try:
    from jax._src import compilation_cache, compiler  # pylint: disable=g-import-not-at-top
    jax_write = compiler._cache_write  # pylint: disable=protected-access
    put = compilation_cache.put_executable_and_time
  except (ImportError, AttributeError):
    return None
  if tuple(inspect.signature(jax_write).parameters) != _JAX_CACHE_WRITE_ARGS:
    return None  # another JAX's writer: not ours to wrap
  return compiler, jax_write, put


def write_cache_from_every_process() -> bool:
  """In a multi-process CPU job, each process writes its own programs to the persistent compilation cache.

  JAX writes entries from process 0 only (so that processes sharing a bucket do not write the same entry), but on
  CPU the key of the same global program differs between processes (its part hashing the devices' topology), so
  process 0's entries never serve the others and every other process compiled every program again on every run:
  a warm 2-process Digi-Q smoke run took 66 s, and 45 s once process 1 wrote its own. Each process writes only
  its own keys: processes other than 0 replace JAX's private writer; a JAX without it, or with another
  signature, is left as it is (returns False)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or jax.default_backend() != "cpu" or (found := jax_cache_writer()) is None:
    return False
  if jax.process_index() == 0:
    return True  # JAX's own writer writes process 0's programs
  compiler, _, put = found

  def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if host_callbacks or compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
      return None  # what JAX's writer skips too
    try:
      put(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception as e:  # pylint: disable=broad-except  # as JAX's writer: a cache never stops a run
      warnings.warn(f"not writing the compilation cache entry of {module_name!r}: {type(e).__name__}: {e}")
    return None

  compiler._cache_write = write  # pylint: disable=protected-access
  return True


# The compile function `wait_after_compiling` wraps, as JAX 0.10 calls it (`pxla._cached_compilation`).
_JAX_COMPILE_ARGS = ("backend", "computation", "devices")
COMPILE_BARRIER_TIMEOUT_S = 3600.0


def jax_compile_and_client():
  """(JAX's compiler module, its compile function, the coordination service's client) where this JAX has them as
  `wait_after_compiling` expects; else None."""
  try:
    from jax._src import compiler, distributed  # pylint: disable=g-import-not-at-top
    compile_fn = compiler.compile_or_get_cached
    client = distributed.global_state.client
  except (ImportError, AttributeError):
    return None
  if client is None or not hasattr(client, "wait_at_barrier"):
    return None
  if tuple(inspect.signature(compile_fn).parameters)[:3] != _JAX_COMPILE_ARGS:
    return None  # another JAX's compile function: not ours to wrap
  return compiler, compile_fn, client


def wait_after_compiling(environ=os.environ) -> bool:
  """In a multi-process CPU job, a process that has compiled (or loaded) a program spanning several processes
  waits at a barrier of JAX's coordination service until every process has it, before running it.

  The first collective over a set of devices opens a Gloo context, whose rendezvous gives up after XLA's fixed
  30 s: a process that loaded its programs from the cache while its peer compiled them for longer died there
  (`Gloo context initialization failed: DEADLINE_EXCEEDED`, docs/results/README.md#test-suite). The barrier
  waits up to JAXAGENT_COMPILE_BARRIER_TIMEOUT_S (default 3600). Every process compiles the same multi-process
  programs in the same order (JAX's rule for them), so the n-th one's barrier is the same on each. GPU/TPU and
  single-process runs are untouched; a JAX without these names, or with another signature, is left as it is
  (returns False)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1 or jax.default_backend() != "cpu" or (found := jax_compile_and_client()) is None:
    return False
  compiler, compile_fn, client = found
  timeout_s = float(environ.get("JAXAGENT_COMPILE_BARRIER_TIMEOUT_S") or COMPILE_BARRIER_TIMEOUT_S)
  counter, lock = itertools.count(), threading.Lock()

  def compile_then_wait(backend, computation, devices, *args, **kwargs):
    executable = compile_fn(backend, computation, devices, *args, **kwargs)
    if len({d.process_index for d in np.asarray(devices).flat}) > 1:
      with lock:
        n = next(counter)
      try:
        client.wait_at_barrier(f"jaxagent/compiled/{n}", int(timeout_s * 1000))
      except Exception as e:  # pylint: disable=broad-except  # JAX's error says only "DEADLINE_EXCEEDED"
        raise RuntimeError(
            f"process {jax.process_index()} waited {timeout_s:.0f} s after compiling its multi-process program "
            f"#{n} for the other processes to compile theirs: one failed, is slower than that (raise "
            f"JAXAGENT_COMPILE_BARRIER_TIMEOUT_S) or runs other programs: {e}") from e
    return executable

  compiler.compile_or_get_cached = compile_then_wait
  return True


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO; progress goes to tqdm
  config, workdir = _CONFIG.value, _WORKDIR.value
  if workdir is None:
    raise app.UsageError("--workdir is required")
  from jaxagent import recipes  # pylint: disable=g-import-not-at-top  # loads the recipe's dependencies
  from jaxagent.pipeline.config import ConfigError, validate  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline import seeds as seeds_lib  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.provenance import provenance  # pylint: disable=g-import-not-at-top
  from jaxagent.pipeline.stages import write_json  # pylint: disable=g-import-not-at-top
  recipe = recipes.get(config.recipe)
  try:  # before any work: a bad value would otherwise surface stages later
    validate(config, getattr(recipe, "CHOICES", {}), getattr(recipe, "LISTS", {}))
    if hasattr(recipe, "check_config"):  # the recipe's rules across keys (a key another one makes required)
      recipe.check_config(config)
    seeds = seeds_lib.parse_seeds(_SEEDS.value) if _SEEDS.value else None
    if _STOP_AFTER.value and seeds is not None:
      raise ValueError("--stop_after ends one run; drop --seeds (run each seed with --config.seed=K)")
  except (ConfigError, ValueError) as e:
    sys.exit(f"FATAL config error: {e}")
  from jaxagent import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.keep_freed_memory()  # XLA:CPU's large buffers: no fresh pages every step
  if config.get("distributed", False):
    init_distributed()
    wait_after_compiling()
  from jaxagent.recipes import pretrain  # pylint: disable=g-import-not-at-top
  try:  # model.base: the project's pre-trained base, built once into the cache (or a directory)
    pretrain.resolve(config)
  except ValueError as e:
    sys.exit(f"FATAL config error: {e}")
  import jax  # pylint: disable=g-import-not-at-top
  if use_compilation_cache():
    write_cache_from_every_process()

  def write_config(cfg, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    if jax.process_index() == 0:
      with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        f.write(cfg.to_json_best_effort(indent=2))
      # Beside the config, not in it (config.json is read back as a config): the commit, packages, machine.
      write_json(os.path.join(out, "provenance.json"), provenance())

  logging.info("recipe %s → %s", config.recipe, workdir)
  if seeds is None:
    write_config(config, workdir)
    from jaxagent.pipeline import stages as stages_lib  # pylint: disable=g-import-not-at-top
    stages_lib.STOP_AFTER = _STOP_AFTER.value or None
    try:
      recipe.run(config, workdir)
    except stages_lib.StopAfter:
      pass
  else:
    seeds_lib.run_seeds(recipe.run, config, workdir, seeds, write_config, getattr(recipe, "PAIRS", ()))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=_parse_flags)
