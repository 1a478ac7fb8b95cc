"""Does a WebRL policy read the instruction? A check on the `shop_category_order` tasks of a WebRL workdir.

Two tables:
  * the log-probability π_0 (`W/sft`) gives its own demonstrations' replies, by step kind (the cookie banner,
    the category, the sort order, the stop). A kind the model can only get right by reading the intent (the
    category, the order) that stays far below 0 on its own training samples is one it has not learnt to read;
  * for every policy evaluated in `W/eval/<policy>/` (held-out test intents): its success, how often the category
    it clicks is the intent's, and the category it clicks most (a policy that ignores the intent clicks one
    category for every task and solves only the test pairs of that category).

  python data_tools/webrl_instruction_probe.py --workdir /tmp/webrl     # a finished WebRL workdir
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

import numpy as np

from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.sites import catalog
from jaxagent.pipeline import rollout, scoring
from jaxagent.proj.webrl import data
from jaxagent.serving.checkpoint import load_policy

_NOTE = re.compile(r'# Note: I will click "([^"]+)"')
_KINDS = ("cookies", "category", "order", "stop")


def step_kind(reply: str) -> str:
  """Which of the expert's four steps a reply is: the banner, a category, a sort order or the stop."""
  if "exit(" in reply:
    return "stop"
  note = _NOTE.search(reply)
  name = note.group(1) if note else ""
  if "cookies" in name.lower():
    return "cookies"
  return "category" if name.lower() in catalog.CATEGORIES else "order"


def clicked_category(traj) -> str | None:
  """The first category the episode's replies name in their note (lower case), if any."""
  for step in traj.steps:
    note = _NOTE.search(step.action_text or "")
    if note and note.group(1).lower() in catalog.CATEGORIES:
      return note.group(1).lower()
  return None


def intent_category(intent: str) -> str | None:
  words = set(re.findall(r"[a-z]+", intent.lower()))
  found = [c for c in catalog.CATEGORIES if c in words]
  return found[0] if len(found) == 1 else None


def demo_logprobs(workdir: str, batch: int, max_len: int) -> dict[str, tuple[int, float]]:
  """{step kind: (samples, mean summed log-probability of the reply)} of π_0 on its demonstrations."""
  trajs = [t for t in rollout.episodes(TrajectoryStore(os.path.join(workdir, "sft", "demos"))) if t.success == 1.0]
  items, kinds = [], []
  for t in trajs:
    for s in t.steps:
      items.append(data.sample(f"{t.task.id}-{s.step}", s.obs_text, s.action_text))
      kinds.append(step_kind(s.action_text))
  logp = scoring.score(load_policy(os.path.join(workdir, "sft")), items, batch=batch, max_len=max_len)["logp"]
  kinds = np.asarray(kinds)
  return {k: (int((kinds == k).sum()), float(logp[kinds == k].mean())) for k in _KINDS if (kinds == k).any()}


def eval_report(store_dir: str) -> dict:
  trajs = rollout.episodes(TrajectoryStore(store_dir))
  picked = [clicked_category(t) for t in trajs]
  right = [p is not None and p == intent_category(t.task.intent) for t, p in zip(trajs, picked)]
  top, top_n = collections.Counter(picked).most_common(1)[0] if trajs else (None, 0)
  return {"episodes": len(trajs), "success": float(np.mean([t.success == 1.0 for t in trajs])) if trajs else 0.0,
          "category_right": float(np.mean(right)) if trajs else 0.0, "most_clicked": top,
          "most_clicked_share": top_n / max(len(trajs), 1),
          "intent_categories": len({intent_category(t.task.intent) for t in trajs})}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--max-len", type=int, default=4096)
  args = parser.parse_args(argv)
  if not os.path.isdir(os.path.join(args.workdir, "sft", "demos")):
    print(f"{args.workdir}: no sft/demos (not a WebRL workdir past its SFT stage)", file=sys.stderr)
    return 1
  print("π_0 on its own demonstrations: mean log-probability of the reply, by step")
  for kind, (n, lp) in demo_logprobs(args.workdir, args.batch, args.max_len).items():
    print(f"  {kind:<9} {n:>4} samples   {lp:8.3f}")
  eval_dir = os.path.join(args.workdir, "eval")
  names = sorted(d for d in os.listdir(eval_dir) if os.path.isdir(os.path.join(eval_dir, d))) if os.path.isdir(
      eval_dir) else []
  if names:
    print("\nheld-out evaluation: success, the clicked category is the intent's, the category clicked most")
    for name in names:
      r = eval_report(os.path.join(eval_dir, name))
      print(f"  {name:<8} {r['episodes']:>4} episodes  success {r['success']:6.1%}  category right "
            f"{r['category_right']:6.1%}  most clicked {r['most_clicked']} ({r['most_clicked_share']:.0%}; "
            f"{r['intent_categories']} categories asked)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
