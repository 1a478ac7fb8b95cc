"""`data_tools/site_demos.py`: expert demonstrations through the collector into a store and OpenWebVoyager samples."""

import json

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
