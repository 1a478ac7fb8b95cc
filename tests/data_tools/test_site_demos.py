"""`data_tools/site_demos.py`: expert demonstrations through the collector into a store and OpenWebVoyager samples."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from data_tools import site_demos
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.sites import server, tasks

pytestmark = pytest.mark.browser


@pytest.mark.slow
def test_demonstrations_store_and_openwebvoyager_samples(tmp_path):
  suite = tasks.generate(seed=0)["test"]
  chosen = [next(t for t in suite if t.profile == "web" and t.template == template)
            for template in ("forum_replies", "shop_category_sort")]
  with server.SiteServer() as site:
    out = site_demos.make_demos(chosen, str(tmp_path), "openwebvoyager", "web", workers=2, base_url=site.base_url)
  assert out["episodes"] == 2 and out["successes"] == 2
  store = TrajectoryStore(out["store"])
  assert len(store) == 2 and all(store.read(i).success == 1.0 for i in range(2))
  with open(out["il_file"]) as f:
    samples = json.load(f)
  n_steps = sum(len(store.read(i).steps) for i in range(2))
  assert len(samples) == n_steps  # one sample per step
  last = samples[-1]
  assert [m["from"] for m in last["conversations"]][-2:] == ["human", "gpt"]
  assert last["conversations"][-1]["value"].startswith("Thought:") and "ANSWER" in last["conversations"][-1]["value"]
  assert all((tmp_path / "images" / name).exists() for s in samples for name in s["images"])


@pytest.mark.slow
def test_a_killed_demonstration_run_keeps_its_episodes_and_resumes(tmp_path):
  """SIGKILL after the first stored episode: what was stored stays, and a rerun runs only the rest."""
  out = tmp_path / "demos"
  cmd = [sys.executable, "data_tools/site_demos.py", "--out", str(out), "--limit", "6", "--workers", "1"]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
  proc = subprocess.Popen(cmd, cwd=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline and proc.poll() is None:
    if (out / "store").is_dir() and len(TrajectoryStore(out / "store")) >= 1:
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed"
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  kept = [t.task.id for t in TrajectoryStore(out / "store")]
  assert 1 <= len(kept) < 6
  done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  ids = [t.task.id for t in TrajectoryStore(out / "store")]
  assert ids[:len(kept)] == kept and len(ids) == len(set(ids)) == 6
  assert json.loads(done.stdout)["episodes"] == 6
