"""The seed importer on small `.pt` files written with torch in the DigiRL (§4.9) and Digi-Q (§5.6) layouts."""

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import torch  # test-only dependency (setup.py `test` extra), used here to write files in the seeds' format

from data_tools import import_seed_trajectories as imp
from jaxagent import types
from jaxagent.data.store import TrajectoryStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _act(kind, touch="[-1.0, -1.0]", lift="[-1.0, -1.0]", text=""):
  return (f'Action Plan: [{kind}] ; Action Decision: "action_type": "{kind}", "touch_point": "{touch}", '
          f'"lift_point": "{lift}", "typed_text": "{text}"')


def _png(path, value):
  Image.fromarray(np.full((40, 20, 3), value, np.uint8)).save(path)
  return str(path)


def _digirl_traj(tmp, task, n, success, start_value):
  """DigiRL layout: `image_path` is the screenshot AFTER the step (the collector's convention)."""
  steps = []
  for t in range(n):
    last = t == n - 1
    r = 1 if (success and last) else 0
    steps.append({
        "observation": f"Previous Actions: Goal: {task}</s>" if t == 0 else f"Previous Actions: x Goal: {task}</s>",
        "next_observation": f"Previous Actions: y Goal: {task}</s>",
        "image_features": np.full(1408, t, np.float32), "next_image_features": np.full(1408, t + 1, np.float32),
        "image_path": _png(tmp / f"{task[:4]}_{t + 1}.png", start_value + 10 * (t + 1)), "video_path": None,
        "task": task, "reward": r, "done": last, "action": _act("PRESS_HOME"),
        "trajectory_reward": float(success), "mc_return": 0.5 ** (n - 1 - t) * success,
    })
  return steps


def _digiq_traj(tmp, traj_id, n_actions=4):
  rng = np.random.default_rng(traj_id)
  steps = []
  for t in range(2):
    cands = [_act("DUAL_POINT", "[0.5, 0.5]", "[0.5, 0.5]")] + [_act("TYPE", text=f"w{k}") for k in range(n_actions - 1)]
    steps.append({
        "observation": "Previous Actions: Goal: Open settings</s>", "next_observation": "...",
        "image_features": rng.normal(size=1408).astype(np.float32),
        "next_image_features": rng.normal(size=1408).astype(np.float32),
        "image_path": _png(tmp / f"q{traj_id}_{t}.png", 50 * t), "next_image_path": _png(tmp / f"q{traj_id}_{t + 1}.png", 50 * (t + 1)),
        "video_path": None, "task": "Open settings", "reward": int(t == 1), "done": t == 1, "action": cands[0],
        "trajectory_reward": 1.0, "mc_return": 0.95 ** (1 - t), "traj_id": traj_id, "step_id": t,
        "action_list": "<split>".join(cands), "parsed_action_list": [{"action_type": "DUAL_POINT"}] + [None] * (n_actions - 1),
        "q_image_path_list": [f"cursor_images/temp_{traj_id}_{t}_{i}.png" for i in range(n_actions)],
        "parsed_action": {"action_type": "DUAL_POINT"}, "q_image_path": f"cursor_images/temp_{traj_id}_{t}_0.png",
        "q_rep_out_list": rng.normal(size=(n_actions, 16)).astype(np.float32),
        "q_rep_out": None,  # filled below (q_rep_out_list[0])
        "q_response_list": ["Yes"] * n_actions, "q_response": "Yes", "pred_q_response": "unknown",
        "state_summarization": "unknown",
    })
    steps[-1]["q_rep_out"] = steps[-1]["q_rep_out_list"][0]
  return steps


def test_import_digirl_layout_shifts_image_paths(tmp_path):
  imgs = tmp_path / "images"
  imgs.mkdir()
  raw = [_digirl_traj(imgs, "Search hotels", 3, True, 0), _digirl_traj(imgs, "Check weather", 2, False, 100)]
  _png(imgs / "Sear_0.png", 5)  # the env's reset screenshot of the first episode (`{image_id}_0.png`); none for the other
  pt = tmp_path / "general-offline.pt"
  torch.save(raw, pt)
  store_dir = str(tmp_path / "store")
  ids = imp.import_seed_file(str(pt), store_dir)
  assert len(ids) == 2
  store = TrajectoryStore(store_dir)
  t0 = store.read(0)
  assert t0.task.intent == "Search hotels" and t0.task.profile == "device" and len(t0.steps) == 3
  assert t0.success == 1.0 and store.read(1).success == 0.0
  assert [s.reward for s in t0.steps] == [0, 0, 1] and [s.done for s in t0.steps] == [False, False, True]
  np.testing.assert_allclose([s.mc_return for s in t0.steps], [0.25, 0.5, 1.0])
  assert t0.steps[1].info["next_observation"].startswith("Previous Actions: y")
  assert all(s.action.kind == types.ActionKind.HOME for s in t0.steps)  # parsed by agents.autoui
  assert t0.steps[0].info["trajectory_reward"] == 1.0 and t0.meta["seed_format"] == "digirl"
  # redirected: step t acted on the screenshot saved by step t-1; step 0 on the reset screenshot saved before it
  assert t0.steps[0].info["seed_image_path"] == str(imgs / "Sear_0.png")
  assert t0.steps[1].info["seed_image_path"] == raw[0][0]["image_path"]
  assert t0.steps[1].info["seed_next_image_path"] == raw[0][1]["image_path"]
  # screenshots found on disk are copied into the store: step 0 acted on the reset image, step 1 on value 10
  assert store.load_image(t0.steps[0].image_path)[0, 0, 0] == 5
  assert store.load_image(t0.steps[1].image_path)[0, 0, 0] == 10
  t1 = store.read(1)  # its reset screenshot is missing: the seed's path is kept, as for any image not found
  assert t1.steps[0].image_path == t1.steps[0].info["seed_image_path"] == str(imgs / "Chec_0.png")
  assert imp.reset_screenshot_path("/a/b/1716.2_1.png") == "/a/b/1716.2_0.png"
  assert imp.reset_screenshot_path("/a/b/shot.png") is None and imp.reset_screenshot_path(None) is None
  assert store.load_image(t0.steps[2].next_image_path)[0, 0, 0] == 30
  feats = imp.load_step_features(store_dir, t0.steps[2])
  np.testing.assert_array_equal(feats["image_features"], np.full(1408, 2, np.float32))
  np.testing.assert_array_equal(feats["next_image_features"], np.full(1408, 3, np.float32))


def test_import_digiq_layout_keeps_candidates_and_reps(tmp_path):
  imgs = tmp_path / "images"
  imgs.mkdir()
  raw = [_digiq_traj(imgs, 7), _digiq_traj(imgs, 8)]
  pt = tmp_path / "general-2trajs.pt"
  torch.save(raw, pt)
  store_dir = str(tmp_path / "store")
  assert len(imp.import_seed_file(str(pt), store_dir, limit=1)) == 1
  assert len(imp.import_seed_file(str(pt), store_dir)) == 1  # re-import: only the missing episode
  store = TrajectoryStore(store_dir)
  assert len(store) == 2
  traj = store.read(0)
  assert traj.meta["seed_format"] == "digiq" and traj.meta["traj_id"] == 7 and traj.task.id.endswith("/7")
  step = traj.steps[1]
  assert step.step == 1 and step.candidates == raw[0][1]["action_list"].split("<split>")
  assert step.candidates[0] == step.action_text and len(step.candidates) == 4
  assert step.action.kind == types.ActionKind.CLICK and (step.action.x, step.action.y) == (0.5, 0.5)
  assert step.info["q_response_list"] == ["Yes"] * 4 and step.info["parsed_action"] == {"action_type": "DUAL_POINT"}
  assert step.info["q_image_path_list"][2].endswith("_1_2.png")
  feats = imp.load_step_features(store_dir, step)
  np.testing.assert_array_equal(feats["q_rep_out_list"], raw[0][1]["q_rep_out_list"])
  np.testing.assert_array_equal(feats["q_rep_out"], raw[0][1]["q_rep_out_list"][0])
  np.testing.assert_array_equal(feats["image_features"], raw[0][1]["image_features"])
  assert store.load_image(step.image_path)[0, 0, 0] == 50 and store.load_image(step.next_image_path)[0, 0, 0] == 100


def test_images_root_and_missing_images(tmp_path):
  imgs = tmp_path / "elsewhere"
  imgs.mkdir()
  raw = [_digiq_traj(imgs, 1)]
  for s in raw[0]:  # the seed's absolute paths from another machine
    s["image_path"] = "/nonexistent/images/" + os.path.basename(s["image_path"])
    s["next_image_path"] = "/nonexistent/images/" + os.path.basename(s["next_image_path"])
  pt = tmp_path / "x.pt"
  torch.save(raw, pt)
  no_root = TrajectoryStore(str(tmp_path / "a"))
  imp.import_seed_file(str(pt), no_root.path)
  assert no_root.read(0).steps[0].image_path == "/nonexistent/images/q1_0.png"  # kept, not found
  with_root = TrajectoryStore(str(tmp_path / "b"))
  imp.import_seed_file(str(pt), with_root.path, images_root=str(imgs))
  step = with_root.read(0).steps[0]
  assert step.image_path.startswith("images/") and with_root.load_image(step.image_path)[0, 0, 0] == 0


def test_bad_files_give_clear_errors(tmp_path, monkeypatch):
  pt = tmp_path / "bad.pt"
  torch.save({"not": "a list"}, pt)
  with pytest.raises(ValueError, match="list of trajectories"):
    imp.load_seed_file(str(pt))
  torch.save([[{"observation": "o", "action": "a"}]], pt)
  with pytest.raises(ValueError, match="lacks"):
    imp.load_seed_file(str(pt))
  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(ImportError, match="pip install torch"):
    imp.load_seed_file(str(pt))


@pytest.mark.slow
def test_command_line(tmp_path):
  imgs = tmp_path / "images"
  imgs.mkdir()
  pt = tmp_path / "webshop.pt"
  torch.save([_digirl_traj(imgs, "Buy airpods", 2, True, 0)], pt)
  out = subprocess.run([sys.executable, "-m", "data_tools.import_seed_trajectories", "--pt", str(pt),
                        "--store", str(tmp_path / "store"), "--gamma", "0.95"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  assert "imported 1 trajectories" in out.stdout
  store = TrajectoryStore(str(tmp_path / "store"))
  assert len(store) == 1
  # the file says 0.5^k (DigiRL's γ); --gamma 0.95 recomputes G_t = Σ γ^(k-t) r_k = [0.95, 1]
  np.testing.assert_allclose([s.mc_return for s in store.read(0).steps], [0.95, 1.0], rtol=1e-6)
