"""The entry point: override typos name the nearest valid keys; the resolved config lands in the workdir."""

import json
import os
import subprocess
import sys

import pytest
from absl import app

from jaxagent import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IL = os.path.join(ROOT, "configs", "il.py")


def test_typo_in_override_names_nearest_keys():
  with pytest.raises(app.UsageError, match=r"did you mean --config\.optim\.lr"):
    main.check_overrides([f"--config={IL}", "--config.optim.lr_typo=1"])
  with pytest.raises(app.UsageError, match=r"--config\.train\.steps"):
    main.check_overrides([f"--config={IL}:smoke", "--config.train.stpes=3"])


def test_valid_overrides_pass():
  main.check_overrides([f"--config={IL}:smoke", "--config.optim.lr=0.1", "--config.data.seq_len=64"])


def test_flat_keys_cover_nested_blocks():
  keys = main.flat_keys(main.load_config_file(f"{IL}:smoke"))
  assert {"optim.lr", "data.path", "mesh.fsdp", "profile.start_step"} <= set(keys)


def test_cli_rejects_typo_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run([sys.executable, "-m", "jaxagent.main", f"--config={IL}:smoke", f"--workdir={workdir}",
                         "--config.optim.lr_typo=1"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  assert "did you mean --config.optim.lr" in proc.stderr
  assert not workdir.exists()


def test_unknown_recipe_names_the_registered_ones():
  from jaxagent import recipes
  with pytest.raises(ValueError, match="choose one of"):
    recipes.get("nope")
