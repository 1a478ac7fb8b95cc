"""Digi-Q data utilities on synthetic screenshots: screen-change labels, cursor overlay, fine-tuning samples."""

import json
import os

import numpy as np
import pytest

from jaxagent import types
from jaxagent.data import conversation
from jaxagent.proj.digiq import screens as digiq
from jaxagent.data.store import TrajectoryStore


def _act(kind, touch="[-1.0, -1.0]", lift="[-1.0, -1.0]", text=""):
  return (f'Action Plan: [{kind}] ; Action Decision: "action_type": "{kind}", "touch_point": "{touch}", '
          f'"lift_point": "{lift}", "typed_text": "{text}"')


TAP = _act("DUAL_POINT", "[0.5, 0.25]", "[0.5, 0.25]")  # [y, x]
SWIPE = _act("DUAL_POINT", "[0.8, 0.5]", "[0.2, 0.5]")


def _screen(value, h=800, w=400):
  return np.full((h, w, 3), value, np.uint8)


def test_screen_change_label_threshold_on_uniform_screens():
  # uniform screens stay uniform when downscaled: MSE = (Δ)^2 exactly -> 6^2 = 36 > 30, 5^2 = 25 <= 30
  assert digiq.screen_change_label(_screen(100), _screen(106)) == "Yes"
  assert digiq.screen_change_label(_screen(100), _screen(105)) == "No"
  assert digiq.screen_change_label(_screen(100), _screen(100)) == "No"


def test_screen_change_label_on_local_changes():
  a = _screen(255)
  small_change = a.copy()
  small_change[100:108, 100:108] = 0  # 64 px of 320000: MSE ≈ 255² · 64 / 320000 ≈ 13 -> unchanged screen
  assert digiq.screen_change_label(a, small_change) == "No"
  new_page = a.copy()
  new_page[:200] = 0  # a quarter of the screen: MSE ≈ 255² / 4 -> changed
  assert digiq.screen_change_label(a, new_page) == "Yes"
  with pytest.raises(ValueError, match="differ in size"):
    digiq.screen_change_label(a, _screen(255, h=400))


def test_downscale_is_a_quarter():
  assert digiq.downscale(_screen(7, h=803, w=401)).shape == (200, 100, 3)  # int(h / 4), int(w / 4)


def test_tap_pixel_only_for_taps():
  assert digiq.tap_pixel(TAP, width=200, height=400) == (50, 200)  # x = 0.25 · 200, y = 0.5 · 400
  assert digiq.tap_pixel(SWIPE, 200, 400) is None
  assert digiq.tap_pixel(_act("TYPE", text="hi"), 200, 400) is None  # equal points but not DUAL_POINT
  assert digiq.tap_pixel("Action Plan: [] ; nonsense", 200, 400) is None


def test_click_icon_is_transparent_around_an_opaque_centre():
  icon = np.asarray(digiq.click_icon(64))
  assert icon.shape == (64, 64, 4)
  assert icon[0, 0, 3] == 0 and icon[63, 63, 3] == 0  # corners outside the ring
  assert icon[32, 32, 3] == 255 and icon[32, 32, 0] > 200  # red, opaque centre dot
  with pytest.raises(ValueError, match="size"):
    digiq.click_icon(2)


def test_overlay_cursor_centres_the_icon_on_the_touch_point():
  screen = _screen(255)  # H 800, W 400: tap at x = 100, y = 400 -> (25, 100) after the 1/4 downscale
  out = digiq.overlay_cursor(screen, TAP)
  assert out.shape == (200, 100, 3)
  changed = np.argwhere(np.abs(out.astype(int) - 255).sum(-1) > 30)
  cy, cx = changed.mean(0)
  assert abs(cy - 100) <= 1.5 and abs(cx - 25) <= 1.5
  half = digiq.default_icon_size(400) / 2 / 4  # icon radius in the downscaled image
  assert changed[:, 0].min() >= 100 - half - 2 and changed[:, 0].max() <= 100 + half + 2
  # a bigger icon covers more; non-taps are only downscaled
  assert (np.abs(digiq.overlay_cursor(screen, TAP, icon_size=200).astype(int) - 255).sum(-1) > 30).sum() > len(changed)
  np.testing.assert_array_equal(digiq.overlay_cursor(screen, SWIPE), digiq.downscale(screen))
  np.testing.assert_array_equal(digiq.overlay_cursor(screen, "garbage"), digiq.downscale(screen))


def test_representation_prompts_per_action_type():
  tap = digiq.representation_prompt(TAP)
  assert tap.startswith("<image>\nYou're given a user interface. There is a cursor in the screen. The touch "
                        "point is located at [0.5, 0.25] Is this cursor Clicking on any interactive elements?")
  assert tap.endswith("\nRespond only 'Yes' or 'No' (without period / quotation marks) and don't respond "
                      "anything else.")
  assert "If a user now Types hello, will this Type action" in digiq.representation_prompt(_act("TYPE", text="hello"))
  assert "navigate the user to the Home screen?" in digiq.representation_prompt(_act("PRESS_HOME"))
  assert "Is this action effective?" in digiq.representation_prompt("not an action")


def test_representation_prompt_writes_the_parsed_touch_point_as_python_prints_it():
  # `generate_more_click_images_batched.py:parse_action` stores `ast.literal_eval` of the touch point, and
  # `construct_sft_data.py:make_prompt` formats it with an f-string: str([0.165, 0.5]), not the action's text
  action = _act("DUAL_POINT", "[0.1650, 0.5000]", "[0.1650, 0.5000]")
  assert digiq.representation_prompt(action) == (
      "<image>\nYou're given a user interface. There is a cursor in the screen. The touch point is located at "
      "[0.165, 0.5] Is this cursor Clicking on any interactive elements?\nRespond only 'Yes' or 'No' (without "
      "period / quotation marks) and don't respond anything else.")
  assert digiq.parse_action(action) == {"action_type": "DUAL_POINT", "touch_point": [0.165, 0.5],
                                        "lift_point": [0.165, 0.5], "typed_text": ""}
  swipe = digiq.representation_prompt(_act("DUAL_POINT", "[0.8000, 0.5]", "[0.2, 0.5000]"))
  assert "located at [0.8, 0.5] Is this cursor" in swipe  # every DUAL_POINT gets the cursor question
  assert "located at (1, 0.25) Is" in digiq.representation_prompt(_act("DUAL_POINT", "(1, 0.250)", "(1, 0.25)"))
  # the seeds' parse_action gives None (-> the generic question, no cursor) for a missing field or a point that
  # is not two items
  no_text = TAP.replace(', "typed_text": ""', "")
  for bad in (no_text, _act("DUAL_POINT", "[0.5, 0.25, 0.1]", "[0.5, 0.25, 0.1]"), _act("DUAL_POINT", "0.5", "0.5")):
    assert digiq.parse_action(bad) is None
    assert "Is this action effective?" in digiq.representation_prompt(bad)
    assert digiq.tap_pixel(bad, 200, 400) is None


def test_representation_sample_format_and_errors():
  s = digiq.representation_sample("ep-0", "images/ep-0.png", digiq.representation_prompt(TAP), "Yes")
  assert s["id"] == "ep-0" and s["images"] == ["images/ep-0.png"]
  assert [t["from"] for t in s["conversations"]] == ["human", "gpt"] and s["conversations"][1]["value"] == "Yes"
  with pytest.raises(ValueError, match="Yes' or 'No"):
    digiq.representation_sample("x", "a.png", "<image>\nq", "maybe")
  with pytest.raises(ValueError, match="placeholder"):
    digiq.representation_sample("x", "a.png", "no image here", "No")


def test_build_representation_dataset_from_a_store(tmp_path):
  store = TrajectoryStore(str(tmp_path / "store"))
  a, b, c = _screen(255), _screen(255), _screen(0)
  b[:200] = 0  # the tap opened something
  task = types.Task(id="t0", intent="Open settings", site="phone", start_url="http://x/", profile="device")
  obs = lambda img, i: types.Observation(intent=task.intent, step=i, screenshot=img)
  steps = [types.Step(step=0, action_text=TAP, observation=obs(a, 0)),
           types.Step(step=1, action_text=_act("PRESS_BACK"), observation=obs(b, 1)),
           types.Step(step=2, action_text=_act("TYPE", text="wifi"), observation=obs(b, 2))]
  episode = store.append(types.Trajectory(task=task, steps=steps, final_observation=obs(c, 3)))
  path = digiq.build_representation_dataset(store, store.load_image, str(tmp_path / "sft"))
  with open(path) as f:
    samples = json.load(f)
  assert [s["id"] for s in samples] == [f"{episode}-0", f"{episode}-1", f"{episode}-2"]
  assert [s["conversations"][1]["value"] for s in samples] == ["Yes", "No", "Yes"]  # a->b, b->b, b->c
  assert "Clicking on any interactive elements" in samples[0]["conversations"][0]["value"]
  assert "Types wifi" in samples[2]["conversations"][0]["value"]
  # the IL pipeline's loader accepts the file as it is (ids, one <image> per image, a gpt turn)
  loaded = conversation.load_conversations(path)
  assert [item["id"] for item in loaded] == [s["id"] for s in samples]
  assert all(os.path.isfile(p) for item in loaded for p in item["images"])
  q_image = os.path.join(tmp_path, "sft", samples[0]["images"][0])
  from PIL import Image
  with Image.open(q_image) as im:
    np.testing.assert_array_equal(np.asarray(im), digiq.overlay_cursor(a, TAP))


def test_two_processes_writing_the_same_representation_dataset_do_not_collide(tmp_path, monkeypatch):
  """A multi-host run builds the dataset in every process into one directory: the second process writing while the
  first is between its write and its rename (the CI failure: a shared temporary name renamed away) is harmless."""
  store = TrajectoryStore(str(tmp_path / "store"))
  task = types.Task(id="t0", intent="Open settings", site="phone", start_url="http://x/", profile="device")
  obs = lambda img, i: types.Observation(intent=task.intent, step=i, screenshot=img)
  step = types.Step(step=0, action_text=TAP, observation=obs(_screen(255), 0))
  store.append(types.Trajectory(task=task, steps=[step], final_observation=obs(_screen(0), 1)))
  out = str(tmp_path / "sft")
  dump, pid = json.dump, [100]
  monkeypatch.setattr(digiq.os, "getpid", lambda: pid[0])

  def interleaved(obj, f):  # process 100 writes its file; process 101 runs whole before 100 renames it
    dump(obj, f)
    if pid[0] == 100:
      pid[0] = 101
      digiq.build_representation_dataset(store, store.load_image, out)
      pid[0] = 100

  monkeypatch.setattr(digiq.json, "dump", interleaved)
  path = digiq.build_representation_dataset(store, store.load_image, out)
  with open(path) as f:
    assert len(json.load(f)) == 1
  assert sorted(os.listdir(out)) == ["images", "representation_sft.json"]  # no temporary left behind
  assert [n for n in os.listdir(os.path.join(out, "images")) if not n.endswith(".png") or n.startswith(".")] == []
