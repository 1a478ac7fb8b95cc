"""Every config file in configs/ loads with its default and with every variant it declares in `VARIANTS`."""

import glob
import importlib.util
import os

import pytest

from jaxagent import config_lib as common
from jaxagent import recipes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                      if os.path.basename(p) != "__init__.py")


def _load(path):
  spec = importlib.util.spec_from_file_location(f"_cfg_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _cases():
  for path in CONFIG_FILES:
    module = _load(path)
    for variant in (None,) + tuple(getattr(module, "VARIANTS", ())):
      yield pytest.param(path, variant, id=f"{os.path.basename(path)}:{variant or 'default'}")


def test_config_files_exist():
  assert any(p.endswith("il.py") for p in CONFIG_FILES)


@pytest.mark.parametrize("path,variant", list(_cases()))
def test_config_loads(path, variant):
  module = _load(path)
  assert isinstance(getattr(module, "VARIANTS", None), tuple), f"{path} must declare VARIANTS (configs/common.py)"
  cfg = module.get_config(variant)
  assert cfg.recipe in recipes.RECIPES, f"{path}: recipe {cfg.recipe!r} is not registered"
  for block in ("mesh", "train", "optim", "checkpoint", "profile"):
    assert block in cfg, f"{path}:{variant} lacks the shared block {block!r} (use common.base_config())"
  stages = [v for v in cfg.values() if hasattr(v, "get") and "train" in v and "optim" in v]
  for train in [cfg.train] if "steps" in cfg.train else [s.train for s in stages]:
    assert train.steps > 0 and train.batch_size % cfg.train.grad_accum_steps == 0
  assert ("steps" in cfg.train) != bool(stages), f"{path}: either shared steps or per-stage blocks, not both"
  cfg.to_json_best_effort()  # main writes it to the workdir


def test_unknown_variant_is_an_error():
  with pytest.raises(ValueError, match="unknown variant"):
    _load(os.path.join(ROOT, "configs", "il.py")).get_config("nope")


def test_parse_arg_types_and_bare_variant():
  arg = common.parse_arg("smoke,steps=7,fast=true", variant="", steps=1, fast=False)
  assert (arg.variant, arg.steps, arg.fast) == ("smoke", 7, True)
  with pytest.raises(ValueError, match="not one of"):
    common.parse_arg("stpes=3", steps=1)


def test_the_base_flag_starts_webrls_bench_variant_from_the_pretrained_base():
  from jaxagent.pipeline.config import validate  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import webrl  # pylint: disable=g-import-not-at-top
  cfg = _load(os.path.join(ROOT, "configs", "webrl.py")).get_config("bench,base=1")
  validate(cfg, webrl.CHOICES, webrl.LISTS)
  webrl.check_config(cfg)
  assert cfg.model.base == "pretrain" and cfg.tasks.suite == "bench" and cfg.sft.warmup.steps == 0
