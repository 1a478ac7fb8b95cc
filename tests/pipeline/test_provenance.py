"""Provenance: the commit, whether tracked files differ from it, the package versions and the machine, in every
stage's run_config.json and in what a results writer saves."""

import importlib.metadata
import json
import os
import shutil
import subprocess

import ml_collections
import pytest

from jaxagent.pipeline import provenance as prov
from jaxagent.pipeline.stages import RUN_CONFIG, Stages

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
  env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
         "GIT_COMMITTER_EMAIL": "t@t"}
  return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True,
                        env=env).stdout.strip()


def test_it_names_the_commit_packages_python_and_machine():
  p = prov.provenance()
  assert set(p) >= {"commit", "dirty", "packages", "python", "machine"}
  assert set(p["machine"]) >= {"hostname", "platform", "cpu_count", "memory_gib", "devices", "process_count"}
  assert p["machine"]["cpu_count"] >= 1 and p["machine"]["memory_gib"] > 0
  assert p["machine"]["devices"] == ["cpu"] and p["machine"]["process_count"] == 1  # tests run on CPU
  json.dumps(p)  # it goes into JSON files as it is


@needs_git
def test_the_commit_is_this_checkouts_head():
  if not os.path.isdir(os.path.join(REPO, ".git")) and not os.path.isfile(os.path.join(REPO, ".git")):
    pytest.skip("not a git checkout")
  prov._git_state.cache_clear()  # pylint: disable=protected-access  # HEAD may have moved since a test read it
  assert prov.provenance()["commit"] == _git(REPO, "rev-parse", "HEAD")
  assert isinstance(prov.provenance()["dirty"], bool)


def test_package_versions_are_those_installed():
  packages = prov.provenance()["packages"]
  for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy", "ml-collections"):
    assert packages[name] == importlib.metadata.version(name)
  for name, version in packages.items():
    assert version == importlib.metadata.version(name)


@needs_git
def test_dirty_says_whether_a_tracked_file_changed(tmp_path):
  root = tmp_path / "repo"
  root.mkdir()
  _git(root, "init", "-q")
  (root / "a.txt").write_text("one\n")
  _git(root, "add", "a.txt")
  _git(root, "commit", "-q", "-m", "first")
  head = _git(root, "rev-parse", "HEAD")
  assert prov.provenance(root=str(root))["commit"] == head and prov.provenance(root=str(root))["dirty"] is False
  (root / "untracked.txt").write_text("not tracked\n")  # untracked files do not count
  prov._git_state.cache_clear()  # pylint: disable=protected-access  # cached per process, as in a run
  assert prov.provenance(root=str(root))["dirty"] is False
  (root / "a.txt").write_text("two\n")
  prov._git_state.cache_clear()  # pylint: disable=protected-access
  assert prov.provenance(root=str(root))["dirty"] is True
  assert prov.provenance(root=str(root))["commit"] == head


def test_outside_a_checkout_the_commit_is_none_and_nothing_raises(tmp_path, monkeypatch):
  monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no repository above tmp_path counts
  assert prov.git_state(str(tmp_path)) == {"commit": None, "dirty": None}
  monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
  assert prov.git_state(str(tmp_path / "elsewhere")) == {"commit": None, "dirty": None}


def test_with_provenance_adds_it_and_keeps_the_results():
  results = {"il": {"success_rate": 0.5}}
  out = prov.with_provenance(results)
  assert out["il"] == {"success_rate": 0.5} and out["provenance"]["packages"] == prov.packages()
  assert "provenance" not in results


def test_each_stage_writes_it_into_run_config_and_a_rerun_reports_no_drift(tmp_path, capsys):
  config = ml_collections.ConfigDict({"il": {"train": {"steps": 500}}, "seed": 0})
  Stages(str(tmp_path), "t", config).run("il", lambda out: {})
  ran = json.load(open(tmp_path / "il" / RUN_CONFIG))
  assert ran["il.train.steps"] == 500 and ran["seed"] == 0
  assert ran["provenance"]["commit"] == prov.provenance()["commit"]
  assert ran["provenance"]["packages"]["jax"] == importlib.metadata.version("jax")
  assert ran["provenance"]["machine"]["devices"] == ["cpu"]
  Stages(str(tmp_path), "t", config).run("il", lambda out: {})
  assert capsys.readouterr().out.count("done already, skipped\n") == 1  # provenance is no config drift
