"""OpenWebVoyager (`reference/algorithms.md` §2): imitation learning, then exploration → feedback →
optimisation iterations. `python -m jaxagent.main --config=configs/openwebvoyager.py --workdir=DIR`.

Stages, in order; each writes `<workdir>/<stage>/` and, when finished, an atomic `DONE` marker holding its
summary. A restarted run skips finished stages and resumes the running one: rollouts by episode id (the store
keeps every finished episode), trainings from their Orbax checkpoints.

  tasks           disjoint query sets from the bundled sites' train templates (IL, then one per iteration, as
                  the paper's GPT-4o-synthesised queries) and the evaluation episodes (test split, MiniWoB++)
  il/data         the teacher acts on the IL queries: the scripted expert (default), an OpenAI-compatible model
                  with the WebVoyager prompt (GPT-4o), or OpenWebVoyager's released trajectory folders; the
                  successful trajectories become per-step OWV conversation samples (§2.3)
  il/train        the policy trained on them (assistant-token cross-entropy, §2.5)
  il/eval         success rate on the test split (+ MiniWoB++ subset)
  iter<k>/explore the previous policy samples (temperature `explore.temperature`) each query of iteration k,
                  judged, failed queries rerun up to `explore.max_attempts` times, the first success kept (§2.4)
  iter<k>/train   training continues from the previous checkpoint on `mix` of IL and iterations' data
  iter<k>/eval    as il/eval

`<workdir>/results.json` and TensorBoard (`eval/test_success_rate` at step k, 0 = IL) hold the success rate after
IL and after each iteration; a per-stage time table is printed at the end (`timings.json`).
"""

from __future__ import annotations

import copy
import json
import os
import time

from jaxagent.data.store import TrajectoryStore
from jaxagent.recipes import owv_data, owv_explore, owv_policy

DONE = "DONE"


def build_model(config, tokenizer):
  """The VLM (`recipes.il.build_model`): lets `serving.load_policy` rebuild this recipe's checkpoints."""
  from jaxagent.recipes import il  # pylint: disable=g-import-not-at-top
  return il.build_model(config, tokenizer)


def stage_names(config) -> list[str]:
  names = ["tasks", "il/data", "il/train", "il/eval"]
  for k in range(1, int(config.iterations) + 1):
    names += [f"iter{k}/explore", f"iter{k}/train", f"iter{k}/eval"]
  return names


# ------------------------------------------------------------------------------------------ tasks


def stage_tasks(config, workdir, out):
  suites = owv_data.select_tasks(config)
  sizes = {"il": int(config.il.queries), **{f"iter{k}": int(config.explore.queries)
                                            for k in range(1, int(config.iterations) + 1)}}
  sets = owv_data.query_sets(suites["train"], sizes, int(config.seed))
  episodes = int(config.eval.episodes) if int(config.eval.episodes) > 0 else len(suites["test"])  # 0: each once
  sets["test"] = owv_data.query_sets(suites["test"], {"test": episodes}, int(config.eval.seed))["test"]
  for name, tasks in sets.items():
    owv_data.write_tasks(os.path.join(out, f"{name}.jsonl"), tasks)
  return {name: len(tasks) for name, tasks in sets.items()}


def _queries(workdir, name):
  return owv_data.read_tasks(os.path.join(workdir, "tasks", f"{name}.jsonl"))


# ------------------------------------------------------------------------------------ environment


def _pool(config, oracle_targets=False):
  from jaxagent.envs.pool import EnvPool  # pylint: disable=g-import-not-at-top
  from jaxagent.envs.sites import server  # pylint: disable=g-import-not-at-top
  spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "web", "observation": "a11y",
          "oracle_targets": oracle_targets, "base_url": server.ensure_server(int(config.tasks.seed))}
  return EnvPool(spec, num_workers=int(config.env.workers), step_timeout=float(config.env.step_timeout),
                 reset_timeout=float(config.env.reset_timeout))


def _judge(config):
  """(judge, programmatic reference or None): the configured judge; with an LLM judge the programmatic verdict
  is recorded beside it for the agreement figure."""
  from jaxagent.judges import programmatic  # pylint: disable=g-import-not-at-top
  judge = programmatic.make_judge(config.judge)
  reference = None if config.judge.kind == "programmatic" else programmatic.programmatic_judge()
  return owv_explore.ReferencedJudge(judge, reference)


# --------------------------------------------------------------------------------- imitation data


def _teacher(config):
  """(policy, its parser, whether it needs the oracle's targets) for `config.teacher.kind`."""
  if config.teacher.kind == "expert":
    from jaxagent.envs.sites import expert  # pylint: disable=g-import-not-at-top
    policy = expert.ScriptedExpert("openwebvoyager")
    return policy, policy.fmt.parse, True
  if config.teacher.kind == "openai":
    from jaxagent.policies import OpenAIPolicy  # pylint: disable=g-import-not-at-top
    policy = OpenAIPolicy(config.teacher.openai)
    return policy, policy.fmt.parse, False
  raise ValueError(f"config.teacher.kind={config.teacher.kind!r}; use 'expert', 'openai' or 'released' "
                   "(with config.teacher.released_dir)")


def stage_il_data(config, workdir, out):
  if config.teacher.kind == "released":
    summary = owv_data.convert_released(config.teacher.released_dir, os.path.join(out, "samples.json"))
    return {"teacher": "released", **summary}
  policy, parse, oracle = _teacher(config)
  fmt = owv_data.make_format(config)
  store = TrajectoryStore(os.path.join(out, "store"))
  with _pool(config, oracle_targets=oracle) as pool:
    run = owv_explore.pool_round(pool, policy, parse, store, _judge(config), obs_text=fmt.observation_text,
                                 name=f"teacher:{config.teacher.kind}", progress=bool(config.progress))
    trajs = run(_queries(workdir, "il"))
  counts = owv_data.successful_samples(store, out, fmt.n_steps)
  if not counts["samples"]:
    raise RuntimeError(f"the {config.teacher.kind} teacher solved no IL query; check the sites and the browser")
  return {"teacher": config.teacher.kind, "episodes": len(trajs), "teacher_success": _success_rate(trajs),
          **counts, **({"judge": owv_explore.agreement(trajs)} if config.judge.kind != "programmatic" else {})}


# --------------------------------------------------------------------------------------- training


def train_config(config, section):
  """The IL recipe's config for one training stage (`recipe="il"`, so `serving.load_policy` rebuilds it)."""
  c = copy.deepcopy(config)
  c.unlock()
  c.recipe = "il"
  c.train.steps = int(section.steps)
  c.train.batch_size = int(section.batch_size)
  c.optim.lr = float(section.lr)
  c.train.log_every = max(1, min(int(c.train.log_every), int(section.steps)))
  c.checkpoint.every = min(int(c.checkpoint.every), int(section.steps))
  return c


def train_policy(config, workdir: str, items: list[dict], init_from: str | None) -> str:
  """`recipes.il`'s model, loss and pipeline on `items`; a fresh run starts from the policy trained in the
  workdir `init_from` (the previous iteration's checkpoint), else as IL starts (random init or HF weights).
  Resumes from `workdir`'s own Orbax checkpoint when there is one."""
  from jaxagent.data import pipeline  # pylint: disable=g-import-not-at-top
  from jaxagent.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  from jaxagent.recipes import il  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top
  from jaxagent.train import loop  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  tokenizer = load_tokenizer(config.data.tokenizer or config.model.hf_checkpoint or None)
  tokenizer.save_pretrained(os.path.join(workdir, "tokenizer"))
  (model_fn, flops, num_image_tokens, preprocess), pretrained = il.build_model(config, tokenizer)
  if init_from:
    pretrained = lambda: load_policy(init_from, config=config).model
  encode = pipeline.EncodeSample(tokenizer, config.data.seq_len, num_image_tokens, preprocess,
                                 preprocess.crop_size or preprocess.size if preprocess else 0, config.data.max_images)
  ds = pipeline.il_dataset(items, encode, batch_size=config.train.batch_size, seed=int(config.seed))
  return loop.train(config, workdir, model_fn=model_fn, loss_fn=il.il_loss, dataset=ds, flops_per_token=flops,
                    read_options=pipeline.read_options(config.data.num_threads), pretrained=pretrained)


def stage_il_train(config, workdir, out):
  items = owv_data.load_samples(os.path.join(workdir, "il", "data"))
  train_policy(train_config(config, config.il), out, items, init_from=None)
  return {"samples": len(items), "steps": int(config.il.steps)}


# ----------------------------------------------------------------------------- explore, optimise


def _policy_dir(workdir, k):
  return os.path.join(workdir, "il" if k == 0 else f"iter{k}", "train")


def _section_for(config, k):
  return config.il if k == 0 else config.optimize


def stage_explore(config, workdir, out, k):
  fmt = owv_data.make_format(config)
  policy = owv_policy.load(_policy_dir(workdir, k - 1), train_config(config, _section_for(config, k - 1)), fmt,
                           float(config.explore.temperature), seed=int(config.seed) + 100 * k)
  store = TrajectoryStore(os.path.join(out, "store"))
  queries = _queries(workdir, f"iter{k}")
  with _pool(config) as pool:
    result = owv_explore.explore_in_pool(pool, policy, fmt.parse, queries, store, _judge(config),
                                         int(config.explore.max_attempts), name=f"iter{k - 1}_policy",
                                         progress=bool(config.progress))
  counts = owv_data.successful_samples(store, out, fmt.n_steps)
  summary = {**result.summary(len(queries)), **counts, "too_long_prompts": policy.stats["too_long"]}
  if config.judge.kind != "programmatic":
    summary["judge"] = owv_explore.agreement(list(store))
  return summary


def stage_optimize(config, workdir, out, k):
  sources = {"il": owv_data.load_samples(os.path.join(workdir, "il", "data"))}
  for j in range(1, k + 1):
    sources[f"iter{j}"] = owv_data.load_samples(os.path.join(workdir, f"iter{j}", "explore"))
  items = owv_data.mix(sources, owv_data.mix_weights(config, k), int(config.seed) + k)
  if not items:
    raise RuntimeError(f"iteration {k}: the mix {dict(config.mix)} of {[(n, len(s)) for n, s in sources.items()]} "
                       "samples is empty; raise config.mix.il or config.mix.previous")
  train_policy(train_config(config, config.optimize), out, items, init_from=_policy_dir(workdir, k - 1))
  return {"samples": len(items), "sources": {n: len(s) for n, s in sources.items()}, "steps": int(config.optimize.steps)}


# -------------------------------------------------------------------------------------- evaluation


def _success_rate(trajs) -> float:
  return sum(t.success == 1.0 for t in trajs) / len(trajs) if trajs else 0.0


def stage_eval(config, workdir, out, k):
  fmt = owv_data.make_format(config)
  policy = owv_policy.load(_policy_dir(workdir, k), train_config(config, _section_for(config, k)), fmt,
                           float(config.eval.temperature), seed=int(config.eval.seed))
  tasks = _queries(workdir, "test")
  with _pool(config) as pool:
    run = owv_explore.pool_round(pool, policy, fmt.parse, TrajectoryStore(os.path.join(out, "test")),
                                 _judge(config), name=f"iter{k}_policy", progress=bool(config.progress))
    trajs = run(tasks)
  summary = {"test_success_rate": _success_rate(trajs), "episodes": len(trajs),
             "mean_steps": sum(len(t.steps) for t in trajs) / max(len(trajs), 1),
             "too_long_prompts": policy.stats["too_long"]}
  if config.judge.kind != "programmatic":
    summary["judge"] = owv_explore.agreement(trajs)
  if config.eval.miniwob:
    summary["miniwob_success_rate"] = _eval_miniwob(config, out, policy)
  return summary


def _eval_miniwob(config, out, policy) -> float:
  """The policy on a few MiniWoB++ episodes (out of domain for the sites-trained policy); success = the task's
  raw reward 1."""
  from jaxagent.envs import miniwob  # pylint: disable=g-import-not-at-top
  from jaxagent.envs.pool import EnvPool  # pylint: disable=g-import-not-at-top
  from jaxagent.rl.collector import collect  # pylint: disable=g-import-not-at-top
  names = [n.strip() for n in str(config.eval.miniwob).split(",") if n.strip()]
  tasks = miniwob.suite(names, seeds=range(int(config.eval.miniwob_seeds)), max_steps=int(config.tasks.max_steps),
                        split="test")
  store = TrajectoryStore(os.path.join(out, "miniwob"))
  have = owv_explore.stored(store)
  todo = [t for t in tasks if t.id not in have]
  if todo:
    spec = {"kind": "jaxagent.envs.miniwob:MiniWoBEnv", "observation": "a11y", "a11y_keep_unnamed": ["textbox"]}
    with EnvPool(spec, num_workers=min(int(config.env.workers), len(todo)), step_timeout=float(config.env.step_timeout),
                 reset_timeout=float(config.env.reset_timeout)) as pool:
      collect(pool, policy, policy.fmt.parse, todo, store=store, progress=False, keep_screenshots=False,
              policy_name="miniwob_eval")
    have = owv_explore.stored(store)
  return sum(have[t.id].trajectory_reward >= 1.0 for t in tasks) / len(tasks)


# ------------------------------------------------------------------------------------------ driver


def _done_path(workdir, name):
  return os.path.join(workdir, name, DONE)


def run_stage(workdir: str, name: str, fn, times: dict) -> dict:
  """`fn(stage_dir)` unless `<workdir>/<name>/DONE` exists; the summary is written atomically as DONE."""
  path = _done_path(workdir, name)
  if os.path.exists(path):
    print(f"[owv] {name}: done already, skipped", flush=True)
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  out = os.path.join(workdir, name)
  os.makedirs(out, exist_ok=True)
  print(f"[owv] {name} ...", flush=True)
  t0 = time.monotonic()
  summary = fn(out)
  times[name] = times.get(name, 0.0) + time.monotonic() - t0
  owv_data.atomic_write(os.path.join(workdir, "timings.json"), json.dumps(times, indent=1))
  owv_data.atomic_write(path, json.dumps(summary, indent=1))
  print(f"[owv] {name}: {json.dumps(summary)}", flush=True)
  return summary


def stage_fn(config, workdir, name):
  if name == "tasks":
    return lambda out: stage_tasks(config, workdir, out)
  if name == "il/data":
    return lambda out: stage_il_data(config, workdir, out)
  if name == "il/train":
    return lambda out: stage_il_train(config, workdir, out)
  part, _, kind = name.partition("/")
  k = 0 if part == "il" else int(part[len("iter"):])
  return {"explore": lambda out: stage_explore(config, workdir, out, k),
          "train": lambda out: stage_optimize(config, workdir, out, k),
          "eval": lambda out: stage_eval(config, workdir, out, k)}[kind]


def run(config, workdir: str) -> dict:
  from jaxagent.train.metrics import MetricWriter  # pylint: disable=g-import-not-at-top
  times_path = os.path.join(workdir, "timings.json")
  times = json.load(open(times_path, encoding="utf-8")) if os.path.exists(times_path) else {}
  summaries = {}
  for name in stage_names(config):
    summaries[name] = run_stage(workdir, name, stage_fn(config, workdir, name), times)
  results = collect_results(config, summaries)
  owv_data.atomic_write(os.path.join(workdir, "results.json"), json.dumps(results, indent=1))
  writer = MetricWriter(workdir)
  for k, row in enumerate(results["per_iteration"]):
    scalars = {"eval/test_success_rate": row["test_success_rate"]}
    for key in ("miniwob_success_rate", "explore_solved_rate", "judge_agreement"):
      if row.get(key) is not None:
        scalars[f"eval/{key}"] = row[key]
    writer.write_scalars(k, scalars)
  writer.close()
  print("\n" + results_table(results))
  print(time_table(times))
  return results


def collect_results(config, summaries: dict) -> dict:
  rows = []
  for k in range(int(config.iterations) + 1):
    name = "il" if k == 0 else f"iter{k}"
    ev = summaries[f"{name}/eval"]
    row = {"stage": name, "test_success_rate": ev["test_success_rate"], "episodes": ev["episodes"],
           "miniwob_success_rate": ev.get("miniwob_success_rate")}
    if k:
      ex = summaries[f"iter{k}/explore"]
      row.update(explore_solved_rate=ex["solved_rate"], explore_first_attempt_rate=ex["first_attempt_rate"],
                 new_samples=ex["samples"], train_samples=summaries[f"iter{k}/train"]["samples"])
      if ex.get("judge"):
        row["judge_agreement"] = ex["judge"]["agreement"]
    rows.append(row)
  il, last = rows[0]["test_success_rate"], rows[-1]["test_success_rate"]
  return {"per_iteration": rows, "teacher_success": summaries["il/data"].get("teacher_success"),
          "last_minus_il_points": 100 * (last - il),
          "monotone": all(b["test_success_rate"] >= a["test_success_rate"] for a, b in zip(rows, rows[1:]))}


def results_table(results: dict) -> str:
  lines = ["stage   test success  episodes  explore solved (1st try)  new samples  miniwob"]
  for r in results["per_iteration"]:
    ex = (f"{r['explore_solved_rate']:7.1%} ({r['explore_first_attempt_rate']:5.1%})" if "explore_solved_rate" in r
          else " " * 15)
    mw = f"{r['miniwob_success_rate']:.1%}" if r.get("miniwob_success_rate") is not None else "-"
    lines.append(f"{r['stage']:<7} {r['test_success_rate']:12.1%}  {r['episodes']:8d}  {ex:>24}  "
                 f"{r.get('new_samples', ''):>11}  {mw:>7}")
  lines.append(f"last − IL: {results['last_minus_il_points']:+.1f} points; non-decreasing: {results['monotone']}")
  return "\n".join(lines)


def time_table(times: dict) -> str:
  rows = [f"  {k:<16} {v:8.1f} s" for k, v in times.items()]
  return "\n".join(["stage times (this workdir, all runs):"] + rows + [f"  {'total':<16} {sum(times.values()):8.1f} s"])
