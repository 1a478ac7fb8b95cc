"""What an evaluation reports: success rates with Wilson intervals, per-task tables, the spread over seeds, and
an HTML page of the trajectories (screenshots with each tap marked, the failed episodes first)."""

from __future__ import annotations

import html
import math
import os
import statistics
from typing import Mapping, Sequence

import numpy as np

from jaxagent import types


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """The Wilson score interval for a binomial proportion (95 % by default), (0, 1) for n = 0.

  Wilson (1927), JASA 22:209: centre (p + z²/2n) / (1 + z²/n), half-width z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).
  Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0 or n successes.
  """
  if n <= 0:
    return 0.0, 1.0
  if not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: successes={successes} must be in [0, n={n}]")
  p, z2 = successes / n, z * z
  centre = (p + z2 / (2 * n)) / (1 + z2 / n)
  half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
  return max(0.0, centre - half), min(1.0, centre + half)


def summary(trajs: Sequence[types.Trajectory]) -> dict:
  """Success rate over the episodes that ran (errored ones are neither successes nor failures), its 95 %
  Wilson interval, and the mean number of steps."""
  ran = [t for t in trajs if t.status != "errored"]
  k = sum(t.success == 1.0 for t in ran)
  low, high = wilson_interval(k, len(ran))
  return {"success_rate": k / len(ran) if ran else 0.0, "successes": k, "episodes": len(ran),
          "errored": len(trajs) - len(ran), "ci95": [low, high],
          "mean_steps": float(np.mean([len(t.steps) for t in ran])) if ran else 0.0}


def task_key(task: types.Task | str) -> str:
  """The task an episode (a task or its id) is an instance of: the id without the `@<draw>` suffix
  `draw_episodes` adds."""
  return (task if isinstance(task, str) else task.id).split("@", 1)[0]


def by_intent(outcomes: Mapping[str, float], ids: Sequence[str]) -> list[float]:
  """Each intent's mean outcome over its episodes among `ids` (in the order of its first), so that draws of one
  intent count once, as a learning figure counts them."""
  groups: dict[str, list[float]] = {}
  for i in ids:
    groups.setdefault(task_key(i), []).append(outcomes[i])
  return [sum(g) / len(g) for g in groups.values()]


def per_task(trajs: Sequence[types.Trajectory]) -> dict[str, dict]:
  groups: dict[str, list[types.Trajectory]] = {}
  for t in trajs:
    groups.setdefault(task_key(t.task), []).append(t)
  return {key: {**summary(g), "intent": g[0].task.intent, "template": g[0].task.template}
          for key, g in sorted(groups.items())}


def over_seeds(per_seed: Mapping[int, dict]) -> dict:
  """The headline: mean success rate over seeds with its sample standard deviation and range."""
  rates = [s["success_rate"] for s in per_seed.values()]
  return {"mean": statistics.fmean(rates) if rates else 0.0,
          "std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
          "min": min(rates, default=0.0), "max": max(rates, default=0.0), "seeds": sorted(per_seed)}


def _bootstrap_means(per_seed: Sequence[np.ndarray], resamples: int, seed: int) -> np.ndarray:
  """`resamples` means from a hierarchical bootstrap: seeds drawn with replacement, then each drawn seed's
  episodes drawn with replacement, the mean of the drawn seeds' means (Davison & Hinkley 1997, §3.8: resampling
  both stages keeps both sources of variation)."""
  rng = np.random.default_rng(seed)
  means = np.empty(resamples)
  for r in range(resamples):
    picked = rng.integers(0, len(per_seed), len(per_seed))
    means[r] = np.mean([per_seed[i][rng.integers(0, len(per_seed[i]), len(per_seed[i]))].mean() for i in picked])
  return means


def hierarchical_mean(per_seed: Mapping[int, Sequence[float]], resamples: int = 10_000, seed: int = 0) -> dict:
  """One policy over global seeds: `per_seed[s]` each episode's outcome (0/1). The mean of the per-seed means
  and its 95 % interval from the hierarchical (seeds × episodes) bootstrap."""
  seeds = sorted(per_seed)
  outcomes = [np.asarray(per_seed[s], np.float64) for s in seeds]
  if not outcomes or not all(len(o) for o in outcomes):
    raise ValueError(f"hierarchical_mean: every seed needs at least one episode; got {[len(o) for o in outcomes]}")
  lo, hi = np.quantile(_bootstrap_means(outcomes, resamples, seed), [0.025, 0.975])
  return {"mean": float(np.mean([o.mean() for o in outcomes])), "ci95": (float(lo), float(hi)),
          "episodes": [len(o) for o in outcomes]}


def paired_difference(per_seed: Mapping[int, tuple[Sequence[float], Sequence[float]]], resamples: int = 10_000,
                      seed: int = 0) -> dict:
  """Policy B − policy A on the same episodes, over global seeds: `per_seed[s] = (a, b)`, each episode's outcome
  (0/1) for A and B in the same order. The mean of the per-seed mean differences, its 95 % interval from a
  hierarchical bootstrap (seeds resampled with replacement, then each drawn seed's episodes, pairs kept together:
  both sources of variation), and the probability of improvement (the bootstrap means' fraction above 0)."""
  seeds = sorted(per_seed)
  diffs = []
  for s in seeds:
    a, b = (np.asarray(x, np.float64) for x in per_seed[s])
    if a.shape != b.shape or not len(a):
      raise ValueError(f"seed {s}: the two policies' outcomes must pair up ({a.shape} vs {b.shape} episodes)")
    diffs.append(b - a)
  if not diffs:
    raise ValueError("paired_difference: no seed")
  means = _bootstrap_means(diffs, resamples, seed)
  lo, hi = np.quantile(means, [0.025, 0.975])
  return {"mean": float(np.mean([d.mean() for d in diffs])), "ci95": (float(lo), float(hi)),
          "p_improve": float(np.mean(means > 0)), "per_seed": {s: float(d.mean()) for s, d in zip(seeds, diffs)},
          "episodes": [len(d) for d in diffs]}


def strata(task: types.Task) -> dict[str, str]:
  """What a results table breaks an episode down by: its family (the benchmark's, else its template), its tier
  (benchmark tasks) and its split."""
  out = {"family": str(task.meta.get("family") or task.template or "?"), "split": str(task.split or "?")}
  if task.meta.get("tier") is not None:
    out["tier"] = f"tier{task.meta['tier']}"
  return out


def outcomes(trajs: Sequence[types.Trajectory]) -> dict:
  """Each episode that ran (errored ones are neither successes nor failures, as in `summary`): its 0/1 outcome
  and its `strata`, by episode id, so that policies and seeds can be paired and broken down later."""
  ran = [t for t in trajs if t.status != "errored"]
  return {"outcomes": {t.task.id: float(t.success == 1.0) for t in ran},
          "strata": {t.task.id: strata(t.task) for t in ran}}


def comparisons(names: Sequence[str], pairs: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
  """The (policy, baseline) differences to report among `names`: each policy after the first minus the first (the
  start it was trained from), then those of `pairs` (a recipe's `PAIRS`: the comparisons its paper makes) whose
  two policies are both in `names`."""
  wanted = [(name, names[0]) for name in names[1:]]
  return wanted + [(a, b) for a, b in pairs if a in names and b in names and a != b and (a, b) not in wanted]


def by_stratum(per_seed: Mapping[int, Mapping[str, Mapping]], names: Sequence[str], resamples: int = 2_000,
               pairs: Sequence[tuple[str, str]] = ()) -> dict:
  """Per stratum kind (family, tier, split) and value: each policy's mean over seeds with its hierarchical
  interval, and the differences of `comparisons(names, pairs)`, paired on the same episodes. `per_seed[s][name]`
  holds `outcomes` and `strata` (`outcomes()`); a stratum absent from some seed is left out."""
  first = next(iter(per_seed.values()))
  kinds = sorted({k for st in first[names[0]]["strata"].values() for k in st})
  out: dict[str, dict] = {}
  for kind in kinds:
    values = sorted({st.get(kind) for r in per_seed.values() for st in r[names[0]]["strata"].values()} - {None})
    for value in values:
      ids = {s: sorted(i for i, st in r[names[0]]["strata"].items() if st.get(kind) == value
                       and all(i in r[n]["outcomes"] for n in names)) for s, r in per_seed.items()}
      if not all(ids.values()):
        continue
      picked = lambda n, s: [per_seed[s][n]["outcomes"][i] for i in ids[s]]  # pylint: disable=cell-var-from-loop
      row = {n: hierarchical_mean({s: picked(n, s) for s in per_seed}, resamples) for n in names}
      for n, base in comparisons(names, pairs):
        row[f"{n} - {base}"] = paired_difference({s: (picked(base, s), picked(n, s)) for s in per_seed}, resamples)
      out.setdefault(kind, {})[value] = row
  return out


def stratum_table(by: Mapping[str, Mapping[str, Mapping]]) -> str:
  """`by_stratum`'s result as a Markdown table: per stratum, each policy's mean [95 % interval] and each paired
  difference with its interval and P(improvement)."""
  lines = []
  for kind, rows in by.items():
    names = list(next(iter(rows.values())))
    lines += [f"| {kind} | episodes / seed | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for value, row in rows.items():
      cells = []
      for n in names:
        r = row[n]
        cell = f"{100 * r['mean']:+.1f}" if " - " in n else f"{100 * r['mean']:.1f}"
        cell += f" [{100 * r['ci95'][0]:.1f}, {100 * r['ci95'][1]:.1f}]"
        cells.append(cell + (f" P {r['p_improve']:.2f}" if "p_improve" in r else ""))
      lines.append(f"| {value} | {min(row[names[0]]['episodes'])}–{max(row[names[0]]['episodes'])} | "
                   + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines).rstrip()


def table(per_seed: Mapping[int, dict], headline: dict) -> str:
  lines = ["| seed | success | 95 % Wilson | episodes | errored | mean steps |", "|---|---|---|---|---|---|"]
  for seed, s in sorted(per_seed.items()):
    lines.append(f"| {seed} | {100 * s['success_rate']:.1f} % | [{100 * s['ci95'][0]:.1f}, {100 * s['ci95'][1]:.1f}] "
                 f"| {s['episodes']} | {s['errored']} | {s['mean_steps']:.1f} |")
  lines.append(f"| mean ± std | {100 * headline['mean']:.1f} ± {100 * headline['std']:.1f} % | | | | |")
  return "\n".join(lines)


def policy_table(results: Mapping[str, dict], names: Sequence[str] | None = None,
                 pairs: Sequence[tuple[str, str]] = ()) -> str:
  """A recipe's closing table: per evaluated policy (`names`, default every result with a success rate), its
  success rate with its 95 % Wilson interval, episodes, distinct intents, temperature and mean steps; the
  benchmark's negative control (`results["control"]`) below it, under the same columns; then each difference of
  `comparisons(names, pairs)`, paired intent by intent on the episodes both played (an intent's draws averaged), with
  its bootstrap interval
  (one run: the spread over intents only; `--seeds` adds the spread over seeds)."""
  names = [n for n, r in results.items() if isinstance(r, dict) and "success_rate" in r] if names is None else list(
      names)
  control = results.get("control") if isinstance(results.get("control"), dict) else {}
  labels = names + [f"control: {n}" for n in control]
  width = max([len("policy")] + [len(n) for n in labels]) + 1
  rows = [f"{'policy':<{width}} success  95 % Wilson     episodes  intents  temperature  mean steps"]
  for label, r in [(n, results[n]) for n in names] + [(f"control: {n}", r) for n, r in control.items()]:
    lo, hi = r.get("ci95") or wilson_interval(round(r["success_rate"] * r["episodes"]), r["episodes"])
    intents = len({task_key(i) for i in r["outcomes"]}) if "outcomes" in r else "-"
    rows.append(f"{label:<{width}} {r['success_rate']:7.1%}  [{lo:5.1%}, {hi:5.1%}]  {r['episodes']:8d}  "
                f"{intents!s:>7}  {r['temperature']:11.2f}  {r['mean_steps']:10.2f}")
  for name, base in comparisons(names, pairs):
    a, b = results[base].get("outcomes"), results[name].get("outcomes")
    shared = sorted(set(a) & set(b)) if a and b else []
    if shared:
      d = paired_difference({0: (by_intent(a, shared), by_intent(b, shared))}, resamples=2_000)
      rows.append(f"{name} − {base}: {100 * d['mean']:+.1f} points [{100 * d['ci95'][0]:+.1f}, "
                  f"{100 * d['ci95'][1]:+.1f}], paired over {d['episodes'][0]} intents")
  return "\n".join(rows)


# ------------------------------------------------------------------------------------------- HTML


def _mark(image_path: str, action: types.Action | None, out_path: str) -> str:
  """A copy of the screenshot with the action's tap (and a swipe's lift point) drawn on it."""
  from PIL import Image, ImageDraw  # pylint: disable=g-import-not-at-top
  image = Image.open(image_path).convert("RGB")
  if action is not None and action.x is not None and action.y is not None:
    draw = ImageDraw.Draw(image)
    scale = (image.width, image.height) if action.normalized else (1.0, 1.0)
    r = max(4, image.width // 40)
    points = [(action.x, action.y)] + ([(action.x2, action.y2)] if action.x2 is not None else [])
    xy = [(px * scale[0], py * scale[1]) for px, py in points]
    if len(xy) == 2:
      draw.line(xy, fill=(255, 0, 0), width=max(2, r // 2))
    for cx, cy in xy[:1]:
      draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=(255, 0, 0), width=max(2, r // 3))
  image.save(out_path)
  return out_path


def html_report(path: str, title: str, trajs: Sequence[types.Trajectory], store_root: str,
                max_episodes: int = 200) -> str:
  """`path` (an .html file) with each episode's steps: screenshot with the tap marked, the model's output, the
  verdict; failed and errored episodes first. Marked images are written next to it."""
  out_dir = os.path.dirname(os.path.abspath(path))
  img_dir = os.path.join(out_dir, "report_images")
  os.makedirs(img_dir, exist_ok=True)
  order = sorted(trajs, key=lambda t: (t.status != "errored", t.success == 1.0, t.task.id))[:max_episodes]
  parts = [f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;margin:1em}details{margin:.5em 0;border:1px solid #ccc;padding:.3em}"
           ".ok{color:#070}.bad{color:#b00}.steps{display:flex;flex-wrap:wrap;gap:.5em}figure{margin:0;width:220px}"
           "figure img{width:220px;border:1px solid #999}figcaption{font-size:11px;white-space:pre-wrap;"
           "word-break:break-word}</style>", f"<h1>{html.escape(title)}</h1>"]
  for n, t in enumerate(order):
    verdict = "errored" if t.status == "errored" else ("success" if t.success == 1.0 else "failure")
    cls = "ok" if verdict == "success" else "bad"
    parts.append(f"<details{' open' if n < 5 and verdict != 'success' else ''}><summary class={cls}>"
                 f"<b>{verdict}</b> {html.escape(t.task.id)}: {html.escape(t.task.intent)} ({len(t.steps)} steps)"
                 f"</summary><p>{html.escape(t.verdict_reason or t.error)}</p><div class=steps>")
    for s in t.steps:
      img = ""
      if s.image_path and os.path.exists(os.path.join(store_root, s.image_path)):
        name = f"{n:04d}_{s.step:02d}.png"
        _mark(os.path.join(store_root, s.image_path), s.action, os.path.join(img_dir, name))
        img = f"<img src='report_images/{name}' loading=lazy>"
      parts.append(f"<figure>{img}<figcaption>{s.step}: {html.escape(s.action_text[-300:])}</figcaption></figure>")
    parts.append("</div></details>")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(parts))
  return path
