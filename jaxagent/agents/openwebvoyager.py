"""OpenWebVoyager's open-model (idefics2) conversation format and its imitation-data converter.

`reference/algorithms.md` §2.2–2.3, ported from MinorJerry/OpenWebVoyager:
`training/example_dataset_path/stage1_Imitation_Learning/convert_trajectories_to_json.py` (the runtime
`utils_localhost.convert_msg_format_openai_to_localhost` uses the same logic):
  * no system prompt; turn 1 is `"{task}\\nOBSERVATION:\\n<image>\\n{acc_tree}"`, later turns
    `"{fail_obs}OBSERVATION:\\n<image>\\n{acc_tree}"` where `fail_obs` is the execution-failure text or the
    Format ERROR text plus a newline (either WebVoyager failure text maps to OpenWebVoyager's);
  * history compression (`omit_history_last_n_steps`, n=3): the previous 2 user turns become
    `OBSERVATION: <image> (accessibility tree omitted).`, older ones
    `OBSERVATION: screenshot omitted, accessibility tree omitted.`; the task text stays in turn 1;
  * every step of a trajectory becomes one training sample
    `{"id": "<flag>--rNN--stepSS", "images": [<=3 names], "conversations": [{"from", "value"}, ...]}`;
  * accessibility-tree lines longer than 500 words are cut (`filter_acc_tree`).
The action grammar is WebVoyager's with `Restart` and `ANSWER[;: ]` (`webvoyager.PATTERNS_OPENWEBVOYAGER`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from typing import Any, Sequence

from jaxagent.agents import base
from jaxagent.tokens import IMAGE_TOKEN
from jaxagent.agents import webvoyager
from jaxagent.agents import webvoyager_prompts as P
from jaxagent.types import Action, Observation, Step, Task, Trajectory

OMITTED_TREE = "OBSERVATION: <image> (accessibility tree omitted)."
OMITTED_BOTH = "OBSERVATION: screenshot omitted, accessibility tree omitted."
LAST_N = 3


def filter_acc_tree(acc_tree: str) -> str:
  """Cut accessibility-tree lines longer than 500 words (`filter_acc_tree`)."""
  lines = []
  for line in acc_tree.split("\n"):
    lines.append(" ".join(line.split()[:500]) if len(line.split(" ")) > 500 else line)
  return "\n".join(lines)


def fail_prefix(feedback: str) -> str:
  """The `fail_obs` prefix of a later user turn, from the previous step's feedback text."""
  if P.FAIL_OBS_WEBVOYAGER in feedback or P.FAIL_OBS_OPENWEBVOYAGER in feedback:
    return P.FAIL_OBS_OPENWEBVOYAGER + "\n"
  if P.FORMAT_ERROR in feedback:
    return P.FORMAT_ERROR + "\n"
  return ""


def user_turn(task: str, acc_tree: str, feedback: str, first: bool) -> str:
  if first:
    return f"{task}\nOBSERVATION:\n{IMAGE_TOKEN}\n{acc_tree}"
  return f"{fail_prefix(feedback)}OBSERVATION:\n{IMAGE_TOKEN}\n{acc_tree}"


def omit_history_last_n_steps(history: list[dict[str, str]], n_steps: int = LAST_N) -> list[dict[str, str]]:
  """The original's compression of all user turns in `history` (the turns before the current one)."""
  new_history: list[dict[str, str]] = []
  img_num = 0
  for curr in reversed(history):
    curr = dict(curr)
    if curr["from"] != "gpt":
      keep_image = img_num < n_steps - 1
      tail = OMITTED_TREE if keep_image else OMITTED_BOTH
      if curr["value"].startswith("OBSERVATION:"):
        curr["value"] = tail
      else:
        curr["value"] = curr["value"].split("\nOBSERVATION:")[0] + "\n" + tail
      img_num += int(keep_image)
    new_history.insert(0, curr)
  return new_history


def conversations(turns: Sequence[tuple[str, str]], n_steps: int = LAST_N) -> list[list[dict[str, str]]]:
  """Per-step compressed conversations from (user_turn, assistant_reply) pairs, as the converter builds them.

  Sample t is the compression of sample t-1's conversation plus turn t, exactly the original's order
  of operations (compression applied to an already-compressed history).
  """
  samples: list[list[dict[str, str]]] = []
  for user, reply in turns:
    conv = omit_history_last_n_steps(copy.deepcopy(samples[-1]), n_steps) if samples else []
    conv.append({"from": "human", "value": user})
    conv.append({"from": "gpt", "value": reply})
    samples.append(conv)
  return samples


def image_window(step_number: int, n_steps: int = LAST_N) -> range:
  """1-based step numbers whose screenshots sample `step_number` carries (max(1, t-n+1)..t)."""
  return range(max(1, step_number - n_steps + 1), step_number + 1)


def build_samples(task: str, steps: Sequence[tuple[str, str, str]], flag_id: str,
                  n_steps: int = LAST_N) -> list[dict[str, Any]]:
  """Training samples for one trajectory; `steps` = (acc_tree, feedback, reply) per step, in order."""
  turns = [(user_turn(task, filter_acc_tree(tree), feedback, i == 0), reply)
           for i, (tree, feedback, reply) in enumerate(steps)]
  out = []
  for t, conv in enumerate(conversations(turns, n_steps), start=1):
    out.append({
        "id": f"{flag_id}--step{t:02d}",
        "images": [f"{flag_id}--step{i:02d}.png" for i in image_window(t, n_steps)],
        "conversations": conv,
    })
  return out


def trajectory_to_samples(traj: Trajectory, flag_id: str, n_steps: int = LAST_N) -> list[dict[str, Any]]:
  """Samples from a recorded `Trajectory`; each step needs `info["a11y_tree"]` (and `info["error"]`, the
  feedback its observation carried). Images are named `<flag_id>--stepNN.png` (see `copy_images`)."""
  steps = []
  for i, s in enumerate(traj.steps):
    if "a11y_tree" not in s.info:
      raise ValueError(f"trajectory {traj.task.id!r} step {i}: Step.info['a11y_tree'] is missing; record the "
                       "observation's accessibility tree there to convert to OpenWebVoyager samples")
    steps.append((s.info["a11y_tree"], s.info.get("error", ""), s.action_text))
  return build_samples(traj.task.intent, steps, flag_id, n_steps)


def copy_images(traj: Trajectory, flag_id: str, store_root: str, image_dir: str) -> list[str]:
  """Copy each step's screenshot to `image_dir/<flag_id>--stepNN.png` (the converter's renaming)."""
  os.makedirs(image_dir, exist_ok=True)
  names = []
  for t, s in enumerate(traj.steps, start=1):
    if s.image_path is None:
      raise ValueError(f"trajectory {traj.task.id!r} step {t - 1}: Step.image_path is missing")
    name = f"{flag_id}--step{t:02d}.png"
    shutil.copyfile(os.path.join(store_root, s.image_path), os.path.join(image_dir, name))
    names.append(name)
  return names


# ------------------------------------------------------------------ the original's task directories


def sort_key(tdir: str) -> str:
  """`sort_key`: zero-pad the last `--`/`_` field so task 12 sorts after task 3."""
  delim = "--" if "--" in tdir else "_"
  parts = tdir.split(delim)
  return delim.join(parts[:-1]) + delim + parts[-1].zfill(5)


def flag_id_for(task_dir_name: str, round_id: int) -> str:
  return f"{sort_key(task_dir_name.replace('task', ''))}--r{round_id:02d}"


def convert_task_dir(task_dir: str, flag_id: str, n_steps: int = LAST_N) -> list[dict[str, Any]]:
  """Samples from a WebVoyager-4o result directory (`interact_messages.json`, `accessibility_tree{i}.txt`,
  `screenshot{i}.png`), as `process_json_file` does. Callers keep only finished tasks
  (`agent.log` containing `INFO - finish!!`)."""
  with open(os.path.join(task_dir, "interact_messages.json"), encoding="utf-8") as f:
    messages = json.load(f)
  num_steps = len([n for n in os.listdir(task_dir) if n.endswith(".png")])
  if len(messages) != num_steps * 2 + 1:
    raise ValueError(f"{task_dir}: {len(messages)} messages for {num_steps} screenshots; expected "
                     f"system + one user/assistant pair per screenshot")
  first = messages[1]["content"][0]["text"]
  match = re.search(r"Now given a task:(.+?)Please interact with", first, re.DOTALL)
  if match is None:
    raise ValueError(f"{task_dir}: the first user message has no 'Now given a task: ... Please interact with'")
  task = match.group(1).strip()
  steps = []
  for t in range(1, num_steps + 1):
    user, reply = messages[2 * t - 1], messages[2 * t]
    with open(os.path.join(task_dir, f"accessibility_tree{t}.txt"), encoding="utf-8") as f:
      tree = f.read()
    steps.append((tree, user["content"][0]["text"], reply["content"]))
  return build_samples(task, steps, flag_id, n_steps)


# ---------------------------------------------------------------------------------------- format


def _to_messages(conv: Sequence[dict[str, str]], images: dict[int, Any]) -> list[base.Message]:
  """Conversation -> chat messages; `<image>` markers become image parts (as `hf_online_server.py` does)."""
  messages = []
  for turn_index, turn in enumerate(conv):
    if turn["from"] == "gpt":
      messages.append({"role": "assistant", "content": turn["value"]})
      continue
    pieces = turn["value"].split(IMAGE_TOKEN)
    parts: list[dict[str, Any]] = []
    for j, piece in enumerate(pieces):
      if piece:
        parts.append(base.text_part(piece))
      if j < len(pieces) - 1:
        image = images.get(turn_index // 2)
        if image is None:
          raise ValueError(f"user turn {turn_index // 2} shows an image but its step has no screenshot")
        parts.append(base.image_part(image))
    messages.append({"role": "user", "content": parts})
  return messages


@base.register("openwebvoyager")
class OpenWebVoyager(base.AgentFormat):
  """The idefics2 agent's input: compressed conversation with <=3 screenshots, no system prompt."""

  name = "openwebvoyager"
  supported_kinds = webvoyager.WebVoyagerActreeImage.supported_kinds

  def __init__(self, n_steps: int = LAST_N):
    self.n_steps = n_steps

  def observation_text(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> str:
    return user_turn(base.task_intent(task), filter_acc_tree(observation.a11y_tree), observation.error, not history)

  def conversation(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> list[dict[str, str]]:
    """The `{"from", "value"}` conversation this step's prompt is made of (without the reply)."""
    turns = []
    for i, step in enumerate(history):
      if not step.obs_text:
        raise ValueError(f"history[{i}].obs_text is empty: record `openwebvoyager.observation_text(...)` in "
                         "Step.obs_text for every step")
      turns.append((step.obs_text, step.action_text))
    turns.append((self.observation_text(task, observation, history), ""))
    return conversations(turns, self.n_steps)[-1][:-1]

  def turns(self, observation: Observation, history: Sequence[Step]) -> tuple[list[dict[str, str]], list]:
    """The compressed conversation the samples are built from (`conversation`), with the screenshots its `<image>`
    markers name (the last ≤3, §2.2)."""
    turns = self.conversation(observation.intent, observation, history)
    shots = [s.observation.screenshot if s.observation is not None and s.observation.screenshot is not None
             else s.image_path for s in history] + [observation.screenshot]
    n = sum(t["value"].count(IMAGE_TOKEN) for t in turns)
    return turns, shots[len(shots) - n:] if n else []

  def build_prompt(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> list[base.Message]:
    images = {i: s.image_path for i, s in enumerate(history)}
    images[len(history)] = observation.screenshot
    return _to_messages(self.conversation(task, observation, history), images)

  def _parse(self, text: str) -> Action:
    return webvoyager.parse_reply(text, webvoyager.PATTERNS_OPENWEBVOYAGER, P.FAIL_OBS_OPENWEBVOYAGER)

  def render(self, action: Action, thought: str = "") -> str:
    if action.kind not in self.supported_kinds:
      raise self._unsupported(action)
    return webvoyager.render_reply(action, thought, "Restart")



_URL = re.compile(r" url: \S+")


def compact_tree(tree: str, max_lines: int = 0, drop_urls: bool = False) -> str:
  """The accessibility tree shortened for a small context: `url:` attributes dropped (they carry the episode's
  session id, noise to the policy) and only the first `max_lines` lines kept (0 = all). Element ids are the
  tree's own, so an id the policy reads is the id the env executes."""
  if drop_urls:
    tree = _URL.sub("", tree)
  if max_lines > 0:
    tree = "\n".join(tree.split("\n")[:max_lines])
  return tree


@base.register("openwebvoyager_compact")
class CompactOpenWebVoyager(OpenWebVoyager):
  """OpenWebVoyager's format (§2.2) with `compact_tree` applied to every observation: the CPU default's
  concession to a 1–2k-token context (the paper's 8192 holds the full tree; `max_tree_lines=0, drop_urls=False`
  is the original byte for byte)."""

  name = "openwebvoyager_compact"

  def __init__(self, max_tree_lines: int = 0, drop_urls: bool = False, n_steps: int = LAST_N):
    super().__init__(n_steps)
    self.max_tree_lines, self.drop_urls = int(max_tree_lines), bool(drop_urls)

  def observation_text(self, task, observation, history) -> str:
    obs = dataclasses.replace(observation, a11y_tree=compact_tree(observation.a11y_tree or "",
                                                                  self.max_tree_lines, self.drop_urls))
    return super().observation_text(task, obs, history)
