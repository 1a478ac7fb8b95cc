"""OpenWebVoyager open-model format: the original IL converter's output, byte for byte.

Golden: `tests/agents/data/owv_il_example.json` is MinorJerry/OpenWebVoyager (MIT licence)
`training/example_dataset_path/stage1_Imitation_Learning/IL_json_data/webvoyager_json_data/example.json`
(commit 94efd6f), the 4 samples its converter made from task `WebVoyager-Amazon-human-extend--004`.
The test rebuilds that task directory (GPT-4o messages, trees, screenshots) from the golden and
converts it with our port, then checks the runtime prompt builder gives the same conversations.
"""

import json
import os

import numpy as np
import pytest

from jaxagent.agents import base
from jaxagent.agents import get_format
from jaxagent.agents import openwebvoyager as owv
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import Action, ActionKind, Observation, Step, Task, Trajectory

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "owv_il_example.json")
FLAG = "WebVoyager-Amazon-human-extend--00004--r01"


@pytest.fixture(scope="module")
def golden():
  with open(GOLDEN, encoding="utf-8") as f:
    return json.load(f)


def _trees_and_replies(golden):
  trees = [s["conversations"][-2]["value"].split("<image>\n", 1)[1] for s in golden]
  replies = [s["conversations"][-1]["value"] for s in golden]
  task = golden[0]["conversations"][0]["value"].split("\nOBSERVATION:")[0]
  return task, trees, replies


def test_flag_id_matches_the_converter():
  assert owv.flag_id_for("taskWebVoyager-Amazon-human-extend--004", 1) == FLAG


def test_convert_task_dir_reproduces_example_json(golden, tmp_path):
  task, trees, replies = _trees_and_replies(golden)
  messages = [{"role": "system", "content": P.SYSTEM_PROMPT_ACTREE_IMAGE}]
  for t, (tree, reply) in enumerate(zip(trees, replies), start=1):
    text = (P.INIT_MSG.format(ques=task, web="https://www.amazon.com/") + P.OBS_PROMPT_ACTREE_IMAGE if t == 1
            else "Observation: please analyze the attached Accessibility Tree & screenshot and give the Thought and "
                 "Action.\n")
    messages.append({"role": "user", "content": [{"type": "text", "text": text + tree},
                                                 {"type": "image_url", "image_url": {"url": "data:..."}}]})
    messages.append({"role": "assistant", "content": reply})
    (tmp_path / f"accessibility_tree{t}.txt").write_text(tree, encoding="utf-8")
    (tmp_path / f"screenshot{t}.png").write_bytes(base.png_bytes(np.full((4, 4, 3), t, np.uint8)))
  (tmp_path / "interact_messages.json").write_text(json.dumps(messages), encoding="utf-8")
  samples = owv.convert_task_dir(str(tmp_path), FLAG)
  assert samples == golden


def test_runtime_prompt_equals_training_conversation(golden):
  task, trees, replies = _trees_and_replies(golden)
  fmt = get_format("openwebvoyager")
  t = Task(id="x", intent=task, site="web", start_url="https://www.amazon.com/")
  hist = []
  for i, (tree, reply) in enumerate(zip(trees, replies)):
    obs = Observation(a11y_tree=tree, screenshot=np.full((2, 2, 3), i, np.uint8))
    assert fmt.conversation(t, obs, hist) == golden[i]["conversations"][:-1]
    msgs = fmt.build_prompt(t, obs, hist)
    assert all(m["role"] != "system" for m in msgs)
    assert base.count_images(msgs) == len(golden[i]["images"])
    image_refs = [p["image"] for m in msgs if not isinstance(m["content"], str) for p in m["content"]
                  if p["type"] == "image"]
    assert image_refs[-1] is obs.screenshot
    assert image_refs[:-1] == [f"s{j}.png" for j in range(max(0, i - 2), i)]
    hist.append(Step(step=i, obs_text=fmt.observation_text(t, obs, hist), action_text=reply, image_path=f"s{i}.png"))


def test_trajectory_to_samples_and_fail_prefix(golden):
  task, trees, replies = _trees_and_replies(golden)
  steps = [Step(step=i, action_text=r, info={"a11y_tree": tr, "error": ""}) for i, (tr, r) in enumerate(zip(trees, replies))]
  traj = Trajectory(task=Task(id="x", intent=task, site="web", start_url=""), steps=steps)
  assert owv.trajectory_to_samples(traj, FLAG) == golden
  steps[1].info["error"] = P.FAIL_OBS_WEBVOYAGER  # either original failure text maps to OpenWebVoyager's
  steps[2].info["error"] = P.FORMAT_ERROR
  samples = owv.trajectory_to_samples(traj, FLAG)
  assert samples[1]["conversations"][-2]["value"].startswith(P.FAIL_OBS_OPENWEBVOYAGER + "\nOBSERVATION:\n<image>\n")
  assert samples[3]["conversations"][2]["value"] == P.FAIL_OBS_OPENWEBVOYAGER + "\nOBSERVATION: <image> (accessibility tree omitted)."
  assert samples[3]["conversations"][4]["value"] == P.FORMAT_ERROR + "\nOBSERVATION: <image> (accessibility tree omitted)."
  del steps[0].info["a11y_tree"]
  with pytest.raises(ValueError, match=r"Step.info\['a11y_tree'\] is missing"):
    owv.trajectory_to_samples(traj, FLAG)


def test_filter_acc_tree_cuts_long_lines():
  line = " ".join(["w"] * 600)
  assert owv.filter_acc_tree("a\n" + line) == "a\n" + " ".join(["w"] * 500)


def test_parse_and_render():
  f = get_format("openwebvoyager")
  assert f.parse("Thought: t\n\nAction: Restart") == Action(ActionKind.RESTART)
  assert f.parse("Thought: t\n\nAction: ANSWER: yes") == Action(ActionKind.ANSWER, text="yes")
  assert f.parse("no markers") == Action.invalid(P.FORMAT_ERROR)
  assert f.render(Action(ActionKind.SCROLL, element=4, direction="up"), "t") == "Thought: t\n\nAction: Scroll [4]; up"


def test_copy_images_names_match_the_samples(golden, tmp_path):
  task, trees, replies = _trees_and_replies(golden)
  store = tmp_path / "store"
  store.mkdir()
  steps = []
  for i, (tree, reply) in enumerate(zip(trees, replies)):
    (store / f"img{i}.png").write_bytes(base.png_bytes(np.full((3, 3, 3), i, np.uint8)))
    steps.append(Step(step=i, action_text=reply, image_path=f"img{i}.png", info={"a11y_tree": tree}))
  traj = Trajectory(task=Task(id="x", intent=task, site="web", start_url=""), steps=steps)
  names = owv.copy_images(traj, FLAG, str(store), str(tmp_path / "images"))
  samples = owv.trajectory_to_samples(traj, FLAG)
  assert names == [f"{FLAG}--step{t:02d}.png" for t in range(1, 5)]
  assert {n for s in samples for n in s["images"]} == set(names)
  assert (tmp_path / "images" / names[2]).read_bytes() == (store / "img2.png").read_bytes()
