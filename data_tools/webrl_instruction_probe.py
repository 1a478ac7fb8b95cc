"""Does a WebRL policy read the instruction? A check on a WebRL workdir (the first two tables on the
`shop_category_order` tasks, the third on any):
  * the log-probability π_0 (`W/sft`) gives its own demonstrations' replies, by step kind (the cookie banner,
    the category, the sort order, the stop), and within a click's reply the tokens of the name it quotes in its
    note and of the element id. A kind the model can only get right by reading the intent (the category, the
    order) that stays far below 0 on its own training samples is one it has not learnt to read; an id as
    unlikely as a guess after the right name (log 1/8 ≈ −2.08 for the categories) means it does not even look
    back to the name it wrote a few tokens earlier;
  * for every policy evaluated in `W/eval/<policy>/` (held-out test intents): its success, how often the category
    it clicks is the intent's, and the category it clicks most (a policy that ignores the intent clicks one
    category for every task and solves only the test pairs of that category);
  * for those and any `--eval` store: how many of the arguments it typed come from the episode's intent and how
    many repeat a demonstration's word for word (the benchmark's held-out intents name strings no demonstration
    typed, so a policy that does not copy cannot solve them);
  * with `--copy N`: on N of its demonstrations' steps that type or answer a string, whether its greedy reply writes
    that string, as recorded and with the strings swapped for made-up ones (`data.copy_augment`): a start that
    copies gets both; one that recalls its demonstrations, the first only.
`--policy P` scores and asks another model on W's demonstrations (e.g. the pre-trained base W started from).

  python data_tools/webrl_instruction_probe.py --workdir /tmp/webrl     # a finished WebRL workdir
  python data_tools/webrl_instruction_probe.py --workdir W --no-logprobs --eval E/seed0/episodes
  python data_tools/webrl_instruction_probe.py --workdir W --copy 24 --policy BASE/export/base
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import sys

import numpy as np

from jaxagent.data import copy_augment
from jaxagent.data.conversation import step_samples
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.sites import catalog
from jaxagent.envs.sites.expert import DONE_TEXT
from jaxagent.pipeline import rollout, scoring
from jaxagent.proj.webrl import data
from jaxagent.serving.checkpoint import load_policy
from jaxagent.serving.engine import Engine, GenerationRequest

_NOTE = re.compile(r'# Note: I will click "([^"]+)"')
_ELEMENT = re.compile(r'element="([^"]+)"')
_ARGUMENT = re.compile(r'argument="([^"]*)"')
_STRING = re.compile(r'(?:argument|message)="([^"]*)"')
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


def part_logprobs(tokenizer, reply: str, reply_ids, token_logp) -> dict[str, float]:
  """Summed log-probability of the tokens of a click reply's quoted name (`name`) and of its element id (`id`),
  given the reply's tokens and their log-probabilities (`scoring.score(per_token=True)`); a part the reply does
  not have is left out. A token counts for a part when its characters overlap the part's."""
  ends = [len(tokenizer.decode(list(reply_ids[:k + 1]))) for k in range(len(reply_ids))]
  starts = [0] + ends[:-1]
  offset = tokenizer.decode(list(reply_ids)).find(reply)
  if offset < 0:
    return {}
  spans = {}
  for part, pattern in (("name", _NOTE), ("id", _ELEMENT)):
    found = pattern.search(reply)
    if found:
      spans[part] = (offset + found.start(1), offset + found.end(1))
  out = {}
  for part, (lo, hi) in spans.items():
    out[part] = float(sum(lp for a, b, lp in zip(starts, ends, token_logp) if a < hi and b > lo))
  return out


def solved_demos(workdir: str) -> list:
  return [t for t in rollout.episodes(TrajectoryStore(os.path.join(workdir, "sft", "demos"))) if t.success == 1.0]


def demo_logprobs(workdir: str, batch: int, max_len: int, policy: str = "") -> dict[str, dict]:
  """{step kind: {"samples", "reply", "name", "id"}} of π_0 (or `policy`) on the demonstrations: the mean summed
  log-probability of the whole reply, and for clicks of its quoted name's and element id's tokens; "all": the
  log-probability per reply token over every sample."""
  trajs = solved_demos(workdir)
  items, kinds, replies = [], [], []
  for t in trajs:
    for s in t.steps:
      items.append(data.sample(f"{t.task.id}-{s.step}", s.obs_text, s.action_text))
      kinds.append(step_kind(s.action_text))
      replies.append(s.action_text)
  loaded = load_policy(policy or os.path.join(workdir, "sft"))
  scored = scoring.score(loaded, items, batch=batch, max_len=max_len, per_token=True)
  parts = [part_logprobs(loaded.tokenizer, r, ids, lp)
           for r, ids, lp in zip(replies, scored["reply_ids"], scored["token_logp"])]
  out = {}
  for kind in _KINDS:
    rows = [i for i, k in enumerate(kinds) if k == kind]
    if not rows:
      continue
    out[kind] = {"samples": len(rows), "reply": float(np.mean(scored["logp"][rows]))}
    for part in ("name", "id"):
      values = [parts[i][part] for i in rows if part in parts[i]]
      if values:
        out[kind][part] = float(np.mean(values))
  out["all"] = {"samples": len(items), "per_token": float(scored["logp"].sum() / max(scored["tokens"].sum(), 1))}
  return out


def copy_steps(trajs, copies: int = 0, seed: int = 0) -> list[tuple[list[dict], str]]:
  """(the turns before the reply, the string it types or answers) of every demonstration step that writes one;
  with `copies`, of that many copies of each with its strings swapped (`data.copy_augment`) instead."""
  samples = copy_augment.copies(trajs, copies, seed) if copies else step_samples(trajs)
  out = []
  for sample in samples:
    turns = sample["conversations"]
    m = _STRING.search(turns[-1]["value"])
    if m and m.group(1) != DONE_TEXT:
      out.append((turns[:-1], m.group(1)))
  return out


def greedy_copies(loaded, trajs, n: int, seed: int = 0) -> dict[str, tuple[int, int]]:
  """{"recorded" | "swapped": (right, asked)}: on `n` steps drawn from `copy_steps`, whether the greedy reply
  writes the step's string (as the argument or message of its call)."""
  engine = Engine(loaded, max_batch=8, max_new_tokens=96)
  out = {}
  for name, copies in (("recorded", 0), ("swapped", 1)):
    steps = copy_steps(trajs, copies, seed)
    random.Random(seed).shuffle(steps)
    steps = steps[:n]
    replies = engine.generate([GenerationRequest(prompt=engine.training_prompt(turns), max_tokens=96,
                                                 temperature=0.0) for turns, _ in steps])
    right = 0
    for (_, want), reply in zip(steps, replies):
      m = _STRING.search(reply.text)
      right += bool(m and m.group(1) == want)
    out[name] = (right, len(steps))
  return out


def eval_report(store_dir: str) -> dict:
  trajs = rollout.episodes(TrajectoryStore(store_dir))
  picked = [clicked_category(t) for t in trajs]
  right = [p is not None and p == intent_category(t.task.intent) for t, p in zip(trajs, picked)]
  top, top_n = collections.Counter(picked).most_common(1)[0] if trajs else (None, 0)
  return {"episodes": len(trajs), "success": float(np.mean([t.success == 1.0 for t in trajs])) if trajs else 0.0,
          "category_right": float(np.mean(right)) if trajs else 0.0, "most_clicked": top,
          "most_clicked_share": top_n / max(len(trajs), 1),
          "intent_categories": len({intent_category(t.task.intent) for t in trajs})}


def typed_arguments(trajs) -> list[tuple[str, str]]:
  """(argument, intent) of every typed or searched argument in `trajs`' replies."""
  return [(a, t.task.intent) for t in trajs for s in t.steps for a in _ARGUMENT.findall(s.action_text or "")]


def copy_report(store_dir: str, demo_dir: str) -> dict:
  """Does a policy copy its typed arguments from the episode's intent, or repeat its demonstrations' (a held-out
  intent names strings no demonstration typed)? Counts over every typed argument of the episodes in `store_dir`."""
  seen = {a for a, _ in typed_arguments(rollout.episodes(TrajectoryStore(demo_dir)))}
  typed = typed_arguments(rollout.episodes(TrajectoryStore(store_dir)))
  return {"typed": len(typed), "from_the_intent": sum(a in intent for a, intent in typed),
          "a_demonstration_argument": sum(a in seen for a, _ in typed), "demonstration_arguments": len(seen)}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--max-len", type=int, default=4096)
  parser.add_argument("--eval", action="append", default=[],
                      help="an evaluation's episode store beside W/eval/<policy> (e.g. a jaxagent.evaluate run's "
                      "OUT/seed0/episodes): its typed arguments against the demonstrations'")
  parser.add_argument("--no-logprobs", action="store_true", help="skip the first table (it scores every sample)")
  parser.add_argument("--copy", type=int, default=0, help="ask for N demonstration strings greedily, as recorded "
                      "and swapped for made-up ones")
  parser.add_argument("--policy", default="", help="score and ask this model instead of W/sft (e.g. its base)")
  args = parser.parse_args(argv)
  if not os.path.isdir(os.path.join(args.workdir, "sft", "demos")):
    print(f"{args.workdir}: no sft/demos (not a WebRL workdir past its SFT stage)", file=sys.stderr)
    return 1
  if not args.no_logprobs:
    print(f"{args.policy or 'π_0'} on the demonstrations: mean log-probability of the reply, and of its quoted name "
          "and element id")
    for kind, r in demo_logprobs(args.workdir, args.batch, args.max_len, args.policy).items():
      if kind == "all":
        print(f"  all       {r['samples']:>4} samples   {r['per_token']:.3f} a reply token")
        continue
      parts = "".join(f"   {p} {r[p]:7.3f}" for p in ("name", "id") if p in r)
      print(f"  {kind:<9} {r['samples']:>4} samples   reply {r['reply']:8.3f}{parts}")
  if args.copy:
    loaded = load_policy(args.policy or os.path.join(args.workdir, "sft"))
    print(f"\n{args.policy or 'π_0'} greedy on demonstration steps that write a string: the string right")
    for name, (right, asked) in greedy_copies(loaded, solved_demos(args.workdir), args.copy).items():
      print(f"  {name:<9} {right} of {asked}")
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
  stores = [os.path.join(eval_dir, n) for n in names] + args.eval
  if stores:
    print("\ntyped arguments: copied from the episode's intent, or a demonstration's word for word")
    for store in stores:
      r = copy_report(store, os.path.join(args.workdir, "sft", "demos"))
      print(f"  {store}: {r['typed']} typed, {r['from_the_intent']} from the intent, "
            f"{r['a_demonstration_argument']} a demonstration's (of {r['demonstration_arguments']})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
