"""Does the Digi-Q critic rank candidates better than chance? A check against the scripted expert's actions.

Best-of-N can only improve on the behaviour policy where the critic's argmax candidate is a better action than
the dataset's. On the bundled sites the expert's action is known for every state a demonstration visited: a
behaviour state whose URL (session prefix removed) and AutoUI prompt (goal + previous action) equal a
demonstration step's is the same state, and the expert's action there is the reference. For each demonstration
step index this prints how often the reference is matched by the critic's argmax candidate, by the dataset
action, and by a uniformly random valid candidate (the chance level), over the states that matched.

  python data_tools/critic_ranking.py --workdir /tmp/digiq    # a finished (or past-critic) Digi-Q workdir

The states must be shared: the default's behaviour episodes are on the test pairs, which no demonstration shows,
so on its workdir there is nothing to compare (the tool says so and exits 1); run the pipeline with
`--config.behaviour.splits=train,test` (or `train`) for a workdir it can check.

Two reference columns bound what any critic could do on these data:
  * `any valid`: a valid candidate matches the expert (the ceiling of re-ranking these candidates);
  * `lookup`: a leave-one-out table of the behaviour data itself. A candidate's value is the mean success of the
    *other* visits to the same state (same URL and prompt, hence the same goal) whose dataset action does the
    same thing; unseen actions get the state's mean. Where it beats `argmax-Q`, the outcomes in the data did
    separate the candidates and the critic failed to learn it; where it does not, the data are too thin.

What the actor is trained on matters more than the argmax everywhere: Best-of-N keeps only the states whose best
candidate's advantage clears the threshold. The second table (`selection_report`) gives, on those states, how
often the kept candidate and the dataset action match the expert: Best-of-N helps where the first is higher.

A tap matches when its touch point is within `--tol-x`, `--tol-y` (screen fractions) of the expert's; other
actions when their action type is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxagent import types  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxagent.agents import autoui  # noqa: E402  pylint: disable=g-import-not-at-top

_SESSION = re.compile(r"^.*?/s/[^/]+/")


def state_key(step: types.Step) -> tuple[str, str]:
  """(URL inside the session, prompt): equal for the same page reached by the same last action on one task."""
  return _SESSION.sub("", step.url), step.obs_text


def same_action(action: str, reference: str, tol_x: float = 0.03, tol_y: float = 0.015) -> bool:
  """Whether a candidate does what the reference action does (a valid AutoUI decision of the same type, and
  for taps a touch point within the tolerances). Nothing matches an invalid reference."""
  if not (autoui.is_action_valid(action) and autoui.is_action_valid(reference)):
    return False
  got, want = autoui.digiq_parse_action(action), autoui.digiq_parse_action(reference)
  if got["action_type"] != want["action_type"]:
    return False
  if want["action_type"] != "DUAL_POINT":
    return True
  (x, y), (wx, wy) = (json.loads(got["touch_point"]), json.loads(want["touch_point"]))
  return abs(x - wx) <= tol_x and abs(y - wy) <= tol_y


def ranking_report(demos: Sequence[types.Trajectory], trajs: Sequence[types.Trajectory], rows: np.ndarray,
                   q: np.ndarray, valid: np.ndarray, tol_x: float = 0.03, tol_y: float = 0.015
                   ) -> dict[int, dict[str, float]]:
  """{demonstration step index: {"states", "argmax_q", "dataset", "random_valid"}} (fractions matching the
  expert). `rows` [M, 2] (trajectory, step), `q` [M, N] or [M, N, heads] (heads reduced by max, the code's
  default), `valid` [M, N] as the critic stage writes them to `scores.npz`."""
  reference = _expert_reference(demos)
  q = np.asarray(q)
  q = q.max(-1) if q.ndim == 3 else q
  rows = np.asarray(rows)
  lookup = lookup_values(trajs, rows, tol_x, tol_y)
  hits: dict[int, list[tuple[float, ...]]] = {}
  for r, (i, k) in enumerate(rows):
    step = trajs[int(i)].steps[int(k)]
    ref = reference.get(state_key(step))
    if ref is None or not step.candidates or not np.any(valid[r]):
      continue
    match = [same_action(c, ref[1], tol_x, tol_y) for c in step.candidates]
    best = int(np.argmax(np.where(valid[r], q[r], -np.inf)))
    by_table = int(np.argmax(np.where(valid[r], lookup[r], -np.inf)))  # ties: the first, i.e. the dataset action
    chance = float(np.mean([m for m, ok in zip(match, valid[r]) if ok]))
    ceiling = float(any(m and ok for m, ok in zip(match, valid[r])))
    hits.setdefault(ref[0], []).append((float(match[best]), float(match[0]), chance, float(match[by_table]),
                                        ceiling))
  return {k: {"states": len(v), **dict(zip(COLUMNS, np.mean(v, 0).tolist()))} for k, v in sorted(hits.items())}


COLUMNS = ("argmax_q", "dataset", "random_valid", "lookup", "any_valid")


def _expert_reference(demos: Sequence[types.Trajectory]) -> dict[tuple[str, str], tuple[int, str]]:
  """{state_key: (demonstration step index, expert action)} over the successful demonstrations."""
  reference = {}
  for demo in demos:
    if demo.success == 1.0:
      for k, step in enumerate(demo.steps):
        reference.setdefault(state_key(step), (k, step.action_text))
  return reference


def selection_report(demos: Sequence[types.Trajectory], trajs: Sequence[types.Trajectory], rows: np.ndarray,
                     q: np.ndarray, v: np.ndarray, valid: np.ndarray, threshold: float = 0.10,
                     head_reduce: str = "max", tol_x: float = 0.03, tol_y: float = 0.015
                     ) -> dict[int, dict[str, float]]:
  """{demonstration step index: {"selected", "picked", "dataset"}}: over the states Best-of-N keeps (the best
  candidate's Q − V above `threshold`, `rl.losses.best_of_n_select` as the actor stage runs it), how many
  matched a demonstration state and the fractions of those whose kept candidate / dataset action match the
  expert."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxagent.rl import losses  # pylint: disable=g-import-not-at-top
  idx, adv = losses.best_of_n_select(jnp.asarray(q), jnp.asarray(v), jnp.asarray(valid), head_reduce, True)
  keep = np.asarray(losses.best_of_n_weights(adv, "best-of-n", threshold)) > 0
  idx = np.asarray(idx)
  reference = _expert_reference(demos)
  hits: dict[int, list[tuple[float, float]]] = {}
  for r, (i, k) in enumerate(np.asarray(rows)):
    step = trajs[int(i)].steps[int(k)]
    ref = reference.get(state_key(step))
    if ref is None or not keep[r]:
      continue
    hits.setdefault(ref[0], []).append((float(same_action(step.candidates[idx[r]], ref[1], tol_x, tol_y)),
                                        float(same_action(step.candidates[0], ref[1], tol_x, tol_y))))
  return {k: {"selected": len(h), "picked": float(np.mean([a for a, _ in h])),
              "dataset": float(np.mean([b for _, b in h]))} for k, h in sorted(hits.items())}


def lookup_values(trajs: Sequence[types.Trajectory], rows: np.ndarray, tol_x: float = 0.03, tol_y: float = 0.015
                  ) -> np.ndarray:
  """[M, N] leave-one-out values of every row's candidates: the mean success of the other rows at the same
  state (`state_key`) whose dataset action (candidate 0) is `same_action` as the candidate, else the mean success
  of the state's other rows (0.0 when the state was visited once)."""
  groups: dict[tuple[str, str], list[int]] = {}
  for r, (i, k) in enumerate(rows):
    groups.setdefault(state_key(trajs[int(i)].steps[int(k)]), []).append(r)
  n = max((len(trajs[int(i)].steps[int(k)].candidates or ()) for i, k in rows), default=0)
  values = np.zeros((len(rows), n), np.float64)
  for members in groups.values():
    won = {r: float(trajs[int(rows[r][0])].success == 1.0) for r in members}
    taken = {r: trajs[int(rows[r][0])].steps[int(rows[r][1])].candidates[0] for r in members}
    for r in members:
      others = [o for o in members if o != r]
      prior = float(np.mean([won[o] for o in others])) if others else 0.0
      for c, cand in enumerate(trajs[int(rows[r][0])].steps[int(rows[r][1])].candidates):
        same = [won[o] for o in others if same_action(taken[o], cand, tol_x, tol_y)]
        values[r, c] = float(np.mean(same)) if same else prior
  return values


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="a Digi-Q workdir (il/demos, candidates/store, critic/)")
  parser.add_argument("--tol-x", type=float, default=0.03)
  parser.add_argument("--tol-y", type=float, default=0.015)
  parser.add_argument("--threshold", type=float, default=0.10, help="Best-of-N's Q − V threshold (actor.threshold)")
  parser.add_argument("--head-reduce", default="min", choices=("min", "max", "mean"),
                      help="how Best-of-N reduces the double heads (actor.head_reduce; the CPU default's min)")
  parser.add_argument("--json", default="", help="also write the report here")
  args = parser.parse_args(argv)
  from jaxagent.data.store import TrajectoryStore  # pylint: disable=g-import-not-at-top
  read = lambda path: [s.read(i) for s in [TrajectoryStore(path)] for i in range(len(s))]
  scores = dict(np.load(os.path.join(args.workdir, "critic", "scores.npz")))
  demos = read(os.path.join(args.workdir, "il", "demos"))
  trajs = read(os.path.join(args.workdir, "candidates", "store"))
  report = ranking_report(demos, trajs, scores["rows"], scores["q"], scores["valid"], args.tol_x, args.tol_y)
  if not report:
    print("critic_ranking: no behaviour state matches a demonstration's (same URL and prompt, hence the same goal), so "
          "there is no expert action to compare with: the behaviour episodes are on tasks the demonstrations never "
          "showed (the default's behaviour.splits='test'). Run the pipeline with --config.behaviour.splits=train,test "
          "(or train) to check the critic against the expert.", file=sys.stderr)
    return 1
  print("demo step  states  argmax-Q  dataset  random valid  lookup  any valid  (fraction matching the expert)")
  for k, r in report.items():
    print(f"{k:9d}  {r['states']:6d}  {r['argmax_q']:8.2f}  {r['dataset']:7.2f}  {r['random_valid']:12.2f}"
          f"  {r['lookup']:6.2f}  {r['any_valid']:9.2f}")
  selected = selection_report(demos, trajs, scores["rows"], scores["q"], scores["v"], scores["valid"],
                              args.threshold, args.head_reduce, tol_x=args.tol_x, tol_y=args.tol_y)
  print(f"\nstates Best-of-N keeps (Q − V > {args.threshold}, {args.head_reduce} over heads): fraction matching "
        "the expert")
  print("demo step  kept  kept candidate  dataset action")
  for k, r in selected.items():
    print(f"{k:9d}  {r['selected']:4d}  {r['picked']:14.2f}  {r['dataset']:14.2f}")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump({"ranking": {str(k): v for k, v in report.items()},
                 "selected": {str(k): v for k, v in selected.items()}}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
