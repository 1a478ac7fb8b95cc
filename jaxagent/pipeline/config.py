"""Per-stage configs and the checks that refuse a bad config before any work.

A multi-stage recipe's config holds the shared training blocks (`train`, `optim`, `checkpoint`, ...) without a
step count, batch size or learning rate, and each training stage a section with its own `train` and `optim`
blocks (`config.il.train.steps`, `config.il.optim.lr`); `stage_config` merges them into the config that stage
trains with. So every key is read: a shared value by every stage, a stage's value by that stage.
"""

from __future__ import annotations

import copy
import os
from typing import Mapping, Sequence

from jaxagent.data.packing import PACKING
from jaxagent.models import attention, lora_settings, precision

PATH_KEYS = ("hf_checkpoint", "tokenizer", "path", "released_dir")  # config keys (last component) naming a local path
# the names a path key also takes: "default", a bundled checkpoint, a tokenizer fitted by the run (WebRL's "demos")
NAMED_PATHS = {"hf_checkpoint": ("default", "smollm2"), "tokenizer": ("default", "demos")}
SUITES = ("sites", "bench")  # config.tasks.suite: `pipeline.tasks.stage_tasks`
COUNT_KEYS = ("max_lag", "parse_failures", "repeats")  # config keys (last component) holding a count: an int >= 0


class ConfigError(ValueError):
  """A config value that cannot run; the message names the key, what is allowed and the fix."""


def stage_config(config, section, *, seed_offset: int = 0, steps: int | None = None):
  """The config one training stage runs with: `section.train` / `section.optim` over the shared blocks (`steps`,
  when given, over `section.train.steps`), the seed offset by `seed_offset` (stages draw different batches), and
  logging, warmup and checkpoint intervals capped at the stage's step count."""
  c = copy.deepcopy(config)
  c.unlock()
  c.seed = int(config.seed) + seed_offset
  c.train.update(dict(section.train))
  c.optim.update(dict(section.optim))
  if steps is not None:
    c.train.steps = int(steps)
  steps = int(c.train.steps)
  c.train.log_every = max(1, min(int(c.train.log_every), steps))
  c.optim.warmup_steps = min(int(c.optim.warmup_steps), max(steps // 10, 1))
  c.checkpoint.every = min(int(c.checkpoint.every), steps)
  return c


def check_count(config, key: str, least: int, fix, why: str = "") -> None:
  """`config.<key>` must be a whole number >= `least`; else a ConfigError naming the key, what it counts (`why`)
  and the fix (`--config.<key>=<fix>`)."""
  value = _get(config, key)
  if isinstance(value, bool) or not isinstance(value, int) or value < least:
    raise ConfigError(f"config.{key}={value!r}: must be a whole number >= {least}{f' ({why})' if why else ''}; "
                      f"set --config.{key}={fix}")


def check_tasks(tasks) -> None:
  """`config.tasks.suite`, and for the benchmark `level` and the families in `templates`, refused before any work
  with a ConfigError naming the key."""
  suite = tasks.get("suite", "sites")
  if suite not in SUITES:
    raise ConfigError(f"config.tasks.suite={suite!r} is not one of {SUITES}; set --config.tasks.suite=sites")
  if suite != "bench":
    return
  from jaxagent.envs.sites import bench  # pylint: disable=g-import-not-at-top
  level = tasks.get("level", 0)
  if isinstance(level, bool) or level not in bench.LEVELS:
    raise ConfigError(f"config.tasks.level={level!r} is not a perturbation level of the benchmark "
                     f"{tuple(bench.LEVELS)}; set --config.tasks.level=2 (the headline's)")
  unknown = [f for f in names(tasks.get("templates", "")) if f not in bench.FAMILIES]
  if unknown:
    raise ConfigError(f"config.tasks.templates={tasks.templates!r}: {unknown} are not benchmark families; name "
                     f"some of {tuple(bench.FAMILIES)}, comma-separated, or '' for all")


def _get(config, key: str):
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def _leaves(config, prefix: str = ""):
  for k, v in config.items():
    if hasattr(v, "items"):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def names(value) -> list[str]:
  """A comma-separated config value as its names, spaces around each and empty ones dropped."""
  return [s.strip() for s in str(value).split(",") if s.strip()]


def validate(config, choices: Mapping[str, Sequence[str]] = (), lists: Mapping[str, Sequence[str]] = ()) -> None:
  """Refuses, naming the key: a value of `choices[key]` outside its allowed values, a comma-separated value of
  `lists[key]` with a name outside its allowed names (or none), a required key left unset (None: a variant's
  placeholder), a count (`COUNT_KEYS`) below 0, a `max_lag` > 0 in a multi-process run (`distributed`), and a
  local path (`PATH_KEYS`) that does not exist."""
  choices, lists = dict(choices), dict(lists)
  for key, allowed in choices.items():
    value = _get(config, key)
    if key == "env.browser" and value == "text" and value not in allowed:
      raise ConfigError("config.env.browser='text': the text backend renders WebRL's simplified HTML only, and this "
                        "recipe's agent sees the screen or the accessibility tree; set --config.env.browser=chromium")
    if value not in allowed:
      raise ConfigError(f"config.{key}={value!r} is not one of {tuple(allowed)}; "
                        f"set --config.{key}={allowed[0]} (or another of those)")
  for key, allowed in lists.items():
    listed = names(_get(config, key))
    if not listed or set(listed) - set(allowed):
      raise ConfigError(f"config.{key}={_get(config, key)!r}: name one or more of {tuple(allowed)}, "
                        "comma-separated")
  _check_precision(config.get("model"))
  data = config.get("data")
  if data is not None and hasattr(data, "get") and data.get("packing", "auto") not in PACKING:
    raise ConfigError(f"config.data.packing={data.packing!r} is not one of {PACKING}; set --config.data.packing=auto")
  if config.get("tasks") is not None and "suite" in config.tasks:
    check_tasks(config.tasks)
  env = config.get("env")
  if env is not None and env.get("backend") is not None:
    from jaxagent.envs.backends import BACKENDS  # pylint: disable=g-import-not-at-top
    if env.backend not in BACKENDS:
      raise ConfigError(f"config.env.backend={env.backend!r} is not one of {tuple(BACKENDS)}; "
                        "set --config.env.backend=subprocess (or ray)")
  for key, value in _leaves(config):
    if value is None:
      raise ConfigError(f"config.{key} is required here (this variant has no default for it); "
                        f"set --config.{key}=...")
    if key.rsplit(".", 1)[-1] in COUNT_KEYS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
      raise ConfigError(f"config.{key}={value!r}: must be a whole number >= 0; set --config.{key}=0 (or more)")
    if key.rsplit(".", 1)[-1] == "max_lag" and value and config.get("distributed", False):
      raise ConfigError(f"config.{key}={value!r}: lagged rounds are collected in a thread beside the learner, whose "
                        f"collectives the thread's barriers would interleave across processes; with "
                        f"config.distributed set --config.{key}=0")
    named = value in NAMED_PATHS.get(key.rsplit(".", 1)[-1], ("default",))
    if key.rsplit(".", 1)[-1] in PATH_KEYS and value and not named and not os.path.exists(value):
      raise ConfigError(f"config.{key}={value!r}: no such file or directory; give a local path "
                        f"(--config.{key}=DIR) or '' for the default")


def _check_precision(model) -> None:
  """`model.dtype`, `param_dtype`, `remat` (`models.precision`), `attention` (`models.attention`) and the `lora`
  block (`models.lora_settings`), before any work."""
  if model is None or not hasattr(model, "get"):
    return
  try:
    precision(model)
    attention(model)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if model.get("kind") == "autoui" and model.get("remat", "none") != "none":
    raise ConfigError(f"config.model.remat={model.remat!r}: AutoUI's T5 has no rematerialisation; set "
                      "--config.model.remat=none")
  try:
    lora_settings(model)  # rank a whole number >= 0, alpha > 0, every target a known linear; AutoUI refuses LoRA
  except ValueError as e:
    raise ConfigError(str(e)) from None
