"""Step accuracy on held-out intents: how often a WebRL-format policy's action at each step of the scripted
expert's episode is the expert's (Mind2Web's element accuracy and step success rate, on the sites benchmark).

A policy at the benchmark's floor solves nothing, and its success rate cannot say which step it misses. Here the
expert plays each intent of the split once (on the run's own observation: the text backend, its world, its prompt
cut), and at every step the policy answers greedily from the expert's history; a step is right when its action
has the expert's kind, element and string. Reported by family and by the expert's step (a click, a type, the
stop), with the share of episodes whose every step is right (teacher-forced: an upper bound on what the policy
would solve alone). The expert's episodes are evaluation data only: no recipe trains on this split.

  python data_tools/step_accuracy.py --workdir W                      # W/sft on every test intent: W/steps/
  python data_tools/step_accuracy.py --workdir W --policy P/export/base --out W/steps_base
  python data_tools/step_accuracy.py --paired A/steps/steps.jsonl B/steps/steps.jsonl [--paired ... (a seed each)]

`--paired` compares two policies on the same expert steps (B − A): per intent, the share of its steps right (each
intent counts once, however many steps it has), over every step and by the expert's step kind, with the
hierarchical bootstrap's 95 % interval over seeds and intents (`pipeline.report.paired_difference`).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys

import ml_collections

from jaxagent.agents.webrl import WebRL
from jaxagent.data.conversation import step_samples
from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.pipeline import device, report
from jaxagent.pipeline.tasks import suite
from jaxagent.proj.webrl import data
from jaxagent.recipes import webrl
from jaxagent.serving.checkpoint import load_policy
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.types import ActionKind

STRING_KINDS = (ActionKind.TYPE, ActionKind.ANSWER)


def same_action(fmt, reply: str, expert_reply: str) -> tuple[bool, bool]:
  """(the whole action right, its element right) of `reply` against the expert's: the same kind and element, and
  for a type or an answer the same string."""
  want, got = fmt.parse(expert_reply), fmt.parse(reply)  # a malformed reply parses as invalid: wrong on both
  element = got.element == want.element
  right = got.kind == want.kind and element and (want.kind not in STRING_KINDS or got.text == want.text)
  return right, element


def step_name(fmt, expert_reply: str) -> str:
  kind = fmt.parse(expert_reply).kind
  return {ActionKind.CLICK: "click", ActionKind.TYPE: "type", ActionKind.ANSWER: "stop"}.get(kind, kind.value)


def expert_episodes(config, workdir: str, split: str, out: str) -> list:
  """The scripted expert on every task of `split` once, on the run's observation (stored in `out/expert`, a rerun
  reads what is stored)."""
  tasks = suite(workdir, split)
  config.train.progress_bar = False
  return device.rollout(config, webrl.env_spec(config, expert=True),
                        ScriptedExpert("webrl", **webrl.format_options(config)), tasks, os.path.join(out, "expert"),
                        "scripted_expert:webrl", gamma=data.GAMMA)


def greedy_replies(loaded, trajs, batch: int = 8, max_tokens: int = 96) -> list[str]:
  """The policy's greedy reply at every step of `trajs` (`data.conversation.step_samples`' order), given the
  expert's history."""
  engine = Engine(loaded, max_batch=batch, max_new_tokens=max_tokens)
  return [r.text for r in engine.generate([GenerationRequest(prompt=engine.training_prompt(s["conversations"][:-1]),
                                                             max_tokens=max_tokens, temperature=0.0)
                                           for s in step_samples(trajs)])]


def tally(fmt, trajs, replies: list[str]) -> tuple[dict, list[dict]]:
  """The tallies of `replies` (one a step of `trajs`, as `greedy_replies`) against the expert's: {"all" | family |
  step kind: counts}, and one record a step (the task, the step, the expert's reply, the policy's, right or not)."""
  family = {t.task.id: (t.task.meta or {}).get("family", t.task.template) for t in trajs}
  counts = collections.defaultdict(collections.Counter)
  episode_right = collections.defaultdict(lambda: True)
  records = []
  for sample, reply in zip(step_samples(trajs), replies, strict=True):
    expert_reply = sample["conversations"][-1]["value"]
    task_id = sample["id"].rsplit("-", 1)[0]
    right, element = same_action(fmt, reply, expert_reply)
    episode_right[task_id] &= right
    records.append({"id": sample["id"], "family": family[task_id], "expert": expert_reply, "reply": reply,
                    "right": right, "element": element})
    for key in ("all", family[task_id], step_name(fmt, expert_reply)):
      counts[key].update(steps=1, right=int(right), element=int(element))
  for task_id, ok in episode_right.items():
    for key in ("all", family[task_id]):
      counts[key].update(episodes=1, episodes_right=int(ok))
  return {k: dict(v) for k, v in counts.items()}, records


def read_records(path: str) -> dict[str, dict]:
  """A `steps.jsonl` by step id; gzipped (`.gz`, as a results page keeps one for later pairing) or not."""
  with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
    return {r["id"]: r for r in map(json.loads, f)}


def paired(pairs: list[tuple[dict, dict]], resamples: int = 10_000) -> dict[str, dict]:
  """B − A on the same expert steps, a (records A, records B) pair a seed (`tally`'s records by step id): {"all" |
  step kind: `report.paired_difference` over intents, each intent's share of its steps right}."""
  fmt = WebRL()
  out = {}
  for kind in ("all", "click", "type", "stop"):
    per_seed = {}
    for s, (a, b) in enumerate(pairs):
      if set(a) != set(b):
        raise ValueError(f"pair {s}: the two step records cover different steps ({len(a)} against {len(b)}); "
                         "run both policies on the same workdir's expert episodes")
      by_intent = collections.defaultdict(lambda: ([], []))
      for step_id in sorted(a):
        if kind == "all" or step_name(fmt, a[step_id]["expert"]) == kind:
          ra, rb = by_intent[step_id.rsplit("-", 1)[0]]
          ra.append(a[step_id]["right"])
          rb.append(b[step_id]["right"])
      if by_intent:
        per_seed[s] = ([sum(ra) / len(ra) for ra, _ in by_intent.values()],
                       [sum(rb) / len(rb) for _, rb in by_intent.values()])
    if per_seed:
      out[kind] = {**report.paired_difference(per_seed, resamples),
                   "a": sum(sum(x[0]) for x in per_seed.values()) / sum(len(x[0]) for x in per_seed.values()),
                   "b": sum(sum(x[1]) for x in per_seed.values()) / sum(len(x[1]) for x in per_seed.values())}
  return out


def table(counts: dict) -> str:
  rows = ["| | steps | step right | element right | episodes every step right |", "|---|---|---|---|---|"]
  pct = lambda a, b: f"{a} ({100 * a / b:.1f} %)" if b else "–"
  for key, c in counts.items():
    rows.append(f"| {key} | {c['steps']} | {pct(c['right'], c['steps'])} | {pct(c['element'], c['steps'])} | "
                f"{pct(c.get('episodes_right', 0), c.get('episodes', 0)) if c.get('episodes') else '–'} |")
  return "\n".join(rows)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", help="a WebRL run's workdir (its config.json and tasks/)")
  parser.add_argument("--paired", nargs=2, action="append", metavar=("A", "B"), default=[],
                      help="two policies' steps.jsonl on the same expert steps (one pair a seed): B − A")
  parser.add_argument("--policy", default="", help="the policy to ask (default: the run's π_0, W/sft)")
  parser.add_argument("--split", default="test")
  parser.add_argument("--out", default="", help="where the expert's episodes and the tallies go (default W/steps)")
  parser.add_argument("--batch", type=int, default=8)
  args = parser.parse_args(argv)
  if args.paired:
    result = paired([(read_records(a), read_records(b)) for a, b in args.paired])
    print("| expert's step | intents | A | B | B − A [95 %] |\n|---|---|---|---|---|")
    for kind, r in result.items():
      print(f"| {kind} | {sum(r['episodes'])} | {100 * r['a']:.1f} % | {100 * r['b']:.1f} % | "
            f"{100 * r['mean']:+.1f} [{100 * r['ci95'][0]:+.1f}, {100 * r['ci95'][1]:+.1f}] |")
    return result
  if not args.workdir:
    parser.error("--workdir W (or --paired A B)")
  with open(os.path.join(args.workdir, "config.json"), encoding="utf-8") as f:
    config = ml_collections.ConfigDict(json.load(f))
  out = args.out or os.path.join(args.workdir, "steps")
  trajs = [t for t in expert_episodes(config, args.workdir, args.split, out) if t.success == 1.0]
  policy = args.policy or os.path.join(args.workdir, "sft")
  counts, records = tally(webrl.agent_format(config), trajs, greedy_replies(load_policy(policy), trajs, args.batch))
  result = {"policy": policy, "split": args.split, "expert_solved": len(trajs), "tally": counts}
  with open(os.path.join(out, "tally.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(out, "steps.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  print(f"{policy} on the expert's steps of {len(trajs)} {args.split} intents (greedy):\n{table(counts)}")
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
  sys.exit(0)
