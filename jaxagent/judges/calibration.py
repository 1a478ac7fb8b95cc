"""Judge calibration: how often a judge agrees with trajectories' known (programmatic) verdicts.

WebVoyager reports 85.3% agreement between its GPT-4V auto-evaluator and human labels (§1.5); on the bundled
sites every trajectory's programmatic verdict is exact, so a judge's agreement can be measured, not estimated:

  python -m jaxagent.judges.calibration --store DIR --judge webvoyager --base-url http://127.0.0.1:8000/v1 \\
      --model NAME [--limit 100] [--json report.json]

`DIR` is a `TrajectoryStore` whose trajectories carry `success` from the programmatic judge (the collector with
`evaluators.ProgrammaticJudge`, e.g. `python data_tools/site_demos.py`); errored or never-judged ones are
skipped. Reported over the trajectories the judge gave a verdict on: accuracy, Cohen's κ (agreement beyond
chance: κ = (p_o − p_e) / (1 − p_e), p_e = Σ_c p_ref(c)·p_judge(c); undefined, reported as null, when
p_e = 1), the confusion matrix (rows: reference, columns: judge), and separately the number left unjudged
(the judge could not be asked or its reply had no verdict), which is never folded into either class.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Sequence

from jaxagent.types import Judge, Trajectory, Verdict


def _label(success: float | None) -> int | None:
  return None if success is None else int(success >= 1.0)


def agreement(reference: Sequence[float], judged: Sequence[float | None]) -> dict[str, Any]:
  """Accuracy, Cohen's κ and the 2x2 confusion matrix of `judged` against `reference` (1 = success).

  `judged[i] is None` counts as unjudged and is left out of every other figure.
  """
  if len(reference) != len(judged):
    raise ValueError(f"agreement: {len(reference)} reference labels but {len(judged)} judged")
  confusion = [[0, 0], [0, 0]]  # confusion[reference][judge]
  unjudged = 0
  for r, j in zip(reference, judged):
    if _label(r) is None:
      raise ValueError("agreement: every reference label must be known (0 or 1)")
    if j is None:
      unjudged += 1
      continue
    confusion[_label(r)][_label(j)] += 1
  n = sum(map(sum, confusion))
  (tn, fp), (fn, tp) = confusion
  accuracy = (tp + tn) / n if n else None
  kappa = None
  if n:
    p_ref, p_judge = (fn + tp) / n, (fp + tp) / n
    p_e = p_ref * p_judge + (1 - p_ref) * (1 - p_judge)
    kappa = (accuracy - p_e) / (1 - p_e) if p_e < 1 else None
  return {"total": len(reference), "judged": n, "unjudged": unjudged, "accuracy": accuracy, "cohen_kappa": kappa,
          "confusion": {"labels": ["failure", "success"], "rows": "reference", "columns": "judge",
                        "matrix": confusion},
          "reference_success_rate": sum(map(_label, reference)) / len(reference) if reference else None,
          "judge_success_rate": (fp + tp) / n if n else None}


@dataclasses.dataclass
class CalibrationReport:
  metrics: dict[str, Any]
  disagreements: list[dict[str, Any]]  # up to `max_listed` (task id, reference, judge, reason)
  unjudged_reasons: list[dict[str, Any]]
  judge_stats: dict[str, Any] | None = None

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def calibrate(judge: Judge, trajectories: Sequence[Trajectory], max_listed: int = 20) -> CalibrationReport:
  """Runs `judge` over labelled trajectories (their `success` is the reference) and compares."""
  labelled = [t for t in trajectories if t.success is not None]
  if not labelled:
    raise ValueError("calibrate: no trajectory has a known verdict (Trajectory.success); collect them with "
                     "a programmatic judge first")
  pairs = [(t.task, t) for t in labelled]
  if hasattr(judge, "evaluate_many"):
    verdicts: list[Verdict] = judge.evaluate_many(pairs)
  else:
    verdicts = [judge.evaluate(task, traj) for task, traj in pairs]
  reference = [float(t.success) for t in labelled]
  metrics = agreement(reference, [v.success for v in verdicts])
  disagreements, unjudged = [], []
  for traj, verdict in zip(labelled, verdicts):
    if verdict.success is None:
      unjudged.append({"task": traj.task.id, "reason": verdict.reason})
    elif _label(verdict.success) != _label(traj.success):
      disagreements.append({"task": traj.task.id, "reference": _label(traj.success),
                            "judge": _label(verdict.success), "reason": verdict.reason[:300]})
  stats = judge.stats.as_dict() if hasattr(getattr(judge, "stats", None), "as_dict") else None
  return CalibrationReport(metrics, disagreements[:max_listed], unjudged[:max_listed], stats)


def load_labelled(store_path: str, limit: int | None = None) -> list[Trajectory]:
  """Trajectories of a store with a known verdict and no crash, images resolvable (meta["image_root"])."""
  from jaxagent.data.store import TrajectoryStore  # pylint: disable=g-import-not-at-top

  store = TrajectoryStore(store_path)
  out = []
  for traj in store:
    if traj.success is None or traj.status == "errored":
      continue
    traj.meta["image_root"] = store.path
    out.append(traj)
    if limit and len(out) >= limit:
      break
  return out


def format_table(report: CalibrationReport) -> str:
  m = report.metrics
  (tn, fp), (fn, tp) = m["confusion"]["matrix"]
  fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
  lines = [
      f"trajectories {m['total']}   judged {m['judged']}   unjudged {m['unjudged']}",
      f"accuracy {fmt(m['accuracy'])}   Cohen's kappa {fmt(m['cohen_kappa'])}",
      "",
      "                    judge: failure  judge: success",
      f"reference failure   {tn:>14d}  {fp:>14d}",
      f"reference success   {fn:>14d}  {tp:>14d}",
  ]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m jaxagent.judges.calibration", description=__doc__.split("\n")[0])
  p.add_argument("--store", required=True, help="TrajectoryStore directory with programmatic verdicts")
  p.add_argument("--judge", default="webvoyager", choices=["webvoyager", "digirl"], help="LLM judge protocol")
  p.add_argument("--base-url", default="", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL / OpenAI)")
  p.add_argument("--model", default="gpt-4o")
  p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key")
  p.add_argument("--api-key-file", default="", help="file whose first line is the key")
  p.add_argument("--max-attached-imgs", type=int, default=3)
  p.add_argument("--max-tokens", type=int, default=1000)
  p.add_argument("--concurrency", type=int, default=8)
  p.add_argument("--cache-dir", default="", help="reuse replies across runs")
  p.add_argument("--limit", type=int, default=0, help="judge at most this many trajectories")
  p.add_argument("--json", default="", help="write the report here")
  args = p.parse_args(argv)

  from jaxagent.judges.llm import LLMJudge, LLMJudgeConfig  # pylint: disable=g-import-not-at-top

  trajectories = load_labelled(args.store, args.limit or None)
  judge = LLMJudge(LLMJudgeConfig(protocol=args.judge, base_url=args.base_url, model=args.model,
                                  api_key_env=args.api_key_env, api_key_file=args.api_key_file,
                                  max_attached_imgs=args.max_attached_imgs, max_tokens=args.max_tokens,
                                  concurrency=args.concurrency, cache_dir=args.cache_dir, image_root=args.store))
  report = calibrate(judge, trajectories)
  print(format_table(report))
  out = {"store": os.path.abspath(args.store), "judge": args.judge, "model": args.model,
         "base_url": args.base_url, **report.as_dict()}
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)
  else:
    json.dump(out, sys.stdout, indent=2)
    print()
  return 0


if __name__ == "__main__":
  sys.exit(main())
