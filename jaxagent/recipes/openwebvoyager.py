"""OpenWebVoyager (`reference/algorithms.md` §2): imitation learning, then exploration → feedback →
optimisation iterations. `python -m jaxagent.main --config=configs/openwebvoyager.py --workdir=DIR`.

Stages, in order; each writes `<workdir>/<stage>/` and, when finished, an atomic `DONE` holding its summary. A
restarted run skips finished stages and resumes the running one: rollouts by episode id, trainings from Orbax.

  tasks           disjoint query sets from the bundled sites' train templates (IL, then one per iteration, as
                  the paper's GPT-4o-synthesised queries) and the evaluation episodes (test split)
  il/data         the teacher acts on the IL queries: the scripted expert (default), an OpenAI-compatible model
                  with the WebVoyager prompt (GPT-4o), or OpenWebVoyager's released trajectory folders; the
                  successful trajectories become per-step OWV conversation samples (§2.3)
  il/train        the policy trained on them (assistant-token cross-entropy, §2.5)
  il/eval         success rate on the test split (+ MiniWoB++ subset)
  iter<k>/explore the previous policy samples each query of iteration k (temperature `explore.temperature`),
                  judged, failed queries rerun up to `explore.max_attempts` times, the first success kept (§2.4)
  iter<k>/train   training continues from the previous checkpoint on `mix` of IL and iterations' data
  iter<k>/eval    as il/eval

`<workdir>/results.json` and TensorBoard (`eval/test_success_rate` at step k, 0 = IL) hold the success rate after
IL and after each iteration.
"""

from __future__ import annotations

import os

from jaxagent.data.store import TrajectoryStore
from jaxagent.envs import miniwob, sites
from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.judges import programmatic
from jaxagent.pipeline import async_collect, rollout
from jaxagent.pipeline.config import names, stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.evaluate import evaluate_actors, evaluate_control, write_results
from jaxagent.pipeline.policy import load_actor
from jaxagent.pipeline.stages import Stages
from jaxagent.pipeline.tasks import bench_splits, disjoint_sets, read_tasks, success_rate, write_tasks
from jaxagent.policies import OpenAIPolicy
from jaxagent.proj.owv import data, explore
from jaxagent.train.metrics import MetricWriter

CHOICES = {
    "env.browser": ("chromium",),
    "model.kind": ("vlm",),
    "teacher.kind": ("expert", "openai", "released"),
    "judge.kind": ("programmatic", "llm", "programmatic+llm"),
}


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "owv", config)
  summaries = {"tasks": stages.run("tasks", lambda out: stage_tasks(config, out))}
  summaries["il/data"] = stages.run("il/data", lambda out: stage_il_data(config, workdir, out))
  summaries["il/train"] = stages.run("il/train", lambda out: stage_il_train(config, workdir, out))
  summaries["il/eval"] = stages.run("il/eval", lambda out: stage_eval(config, workdir, out, 0))
  n = int(config.iterations)

  def explore_round(i, behaviour):  # round i explores iteration i + 1's queries
    out = stages.dir(f"iter{i + 1}/explore")
    os.makedirs(out, exist_ok=True)
    return stage_explore(config, workdir, out, i + 1, behaviour)

  # With explore.max_lag > 0, iteration k+1 explores in the background while k trains and is evaluated.
  with async_collect.AsyncCollector(explore_round, n, int(config.explore.max_lag),
                                    done=lambda i: stages.is_done(f"iter{i + 1}/explore")) as collector:
    collector.publish(0, 0)
    for k in range(1, n + 1):
      summaries[f"iter{k}/explore"] = stages.run(f"iter{k}/explore", lambda out, k=k: collector.result(k - 1))
      summaries[f"iter{k}/train"] = stages.run(f"iter{k}/train", lambda out: stage_optimize(config, workdir, out, k))
      collector.publish(k, k)
      summaries[f"iter{k}/eval"] = stages.run(f"iter{k}/eval", lambda out: stage_eval(config, workdir, out, k))
  summaries["held_out"] = held_out(config, workdir)
  results = collect_results(config, summaries)
  write_results(os.path.join(workdir, "results.json"), results)
  writer = MetricWriter(workdir)
  for k, row in enumerate(results["per_iteration"]):
    keys = ("test_success_rate", "miniwob_success_rate", "explore_solved_rate", "judge_agreement")
    writer.write_scalars(k, {f"eval/{key}": row[key] for key in keys if row.get(key) is not None})
  writer.close()
  print("\n" + results_table(results))
  print(stages.table())
  return results


# ------------------------------------------------------------------------------------------ stages


def stage_tasks(config, out):
  """The IL queries, each iteration's exploration queries and the test episodes, from the train split's one seeded
  shuffle; on the benchmark (`tasks.suite=bench`) the IL queries from `train_a` and the exploration queries from
  `train_c`, with the benchmark's splits written beside them (`control`: the negative control)."""
  iterations = {f"iter{k}": int(config.explore.queries) for k in range(1, int(config.iterations) + 1)}
  if config.tasks.suite == "bench":
    splits = bench_splits(config, "web")
    sets = {**disjoint_sets(splits["train_a"], {"il": int(config.il.queries)}, int(config.seed)),
            **disjoint_sets(splits["train_c"], iterations, int(config.seed))}
    sets.update((name, tasks) for name, tasks in splits.items() if name != "test")
  else:
    splits = sites.select(config.tasks.seed, "web", config.tasks.templates, config.tasks.max_steps)
    sets = disjoint_sets(splits["train"], {"il": int(config.il.queries), **iterations}, int(config.seed))
  episodes = int(config.eval.episodes) if int(config.eval.episodes) > 0 else len(splits["test"])  # 0: each once
  sets["test"] = disjoint_sets(splits["test"], {"test": episodes}, int(config.eval.seed))["test"]
  return {name: write_tasks(os.path.join(out, f"{name}.jsonl"), tasks) for name, tasks in sets.items()}


def _teacher(config):
  """(policy, whether it needs the oracle's targets) for `config.teacher.kind`."""
  if config.teacher.kind == "expert":
    return ScriptedExpert("openwebvoyager"), True
  return OpenAIPolicy(config.teacher.openai), False


def stage_il_data(config, workdir, out):
  if config.teacher.kind == "released":
    summary = data.convert_released(config.teacher.released_dir, os.path.join(out, "samples.json"))
    return {"teacher": "released", **summary}
  policy, oracle = _teacher(config)
  fmt = data.make_format(config)
  store = TrajectoryStore(os.path.join(out, "store"))
  with _rollouts(config, oracle) as r:
    trajs = r.run(policy, _queries(workdir, "il"), store, judge=_judge(config), obs_text=fmt.observation_text,
                  name=f"teacher:{config.teacher.kind}")
  counts = data.successful_samples(store, out, fmt.n_steps)
  if not counts["samples"]:
    raise RuntimeError(f"the {config.teacher.kind} teacher solved no IL query; check the sites and the browser")
  return {"teacher": config.teacher.kind, "episodes": len(trajs), "teacher_success": success_rate(trajs),
          **counts, **_agreement(config, trajs)}


def stage_il_train(config, workdir, out):
  items = data.load_samples(os.path.join(workdir, "il", "data"))
  finetune(stage_config(config, config.il), out, items, agent=data.make_format(config))
  return {"samples": len(items), "steps": int(config.il.train.steps)}


def stage_explore(config, workdir, out, k, behaviour=None):
  """Iteration k's queries explored by policy `behaviour` (default k - 1, the newest: OWV's rule)."""
  behaviour = k - 1 if behaviour is None else int(behaviour)
  policy = load_actor(config, _policy_dir(workdir, behaviour), config.explore.temperature, int(config.seed) + 100 * k)
  store = TrajectoryStore(os.path.join(out, "store"))
  queries = _queries(workdir, f"iter{k}")
  with _rollouts(config) as r:
    result = explore.explore_rollouts(r, policy, queries, store, _judge(config), int(config.explore.max_attempts),
                                      name=f"iter{behaviour}_policy",
                                      meta={"behaviour_policy": behaviour, "policy_lag": k - 1 - behaviour})
  counts = data.successful_samples(store, out, policy.fmt.n_steps)
  return {**result.summary(len(queries)), **counts, "too_long_prompts": policy.stats["too_long"],
          "behaviour_policy": behaviour, "lag": k - 1 - behaviour, **_agreement(config, store)}


def stage_optimize(config, workdir, out, k):
  sources = {"il": data.load_samples(os.path.join(workdir, "il", "data"))}
  for j in range(1, k + 1):
    sources[f"iter{j}"] = data.load_samples(os.path.join(workdir, f"iter{j}", "explore"))
  items = data.mix(sources, data.mix_weights(config, k), int(config.seed) + k)
  if not items:
    raise RuntimeError(f"iteration {k}: the mix {dict(config.mix)} of {[(n, len(s)) for n, s in sources.items()]} "
                       "samples is empty; raise config.mix.il or config.mix.previous")
  finetune(stage_config(config, config.optimize), out, items, agent=data.make_format(config),
           init_from=_policy_dir(workdir, k - 1))
  return {"samples": len(items), "sources": {n: len(s) for n, s in sources.items()},
          "steps": int(config.optimize.train.steps)}


def stage_eval(config, workdir, out, k):
  """Iteration k's actor (0: the IL actor) on the test queries; beside an LLM judge its agreement with the
  programs; with `eval.miniwob` the same actor on MiniWoB++ episodes (out of domain)."""
  def extra(name, policy, trajs):
    more = _agreement(config, trajs)
    if config.eval.miniwob:
      more["miniwob_success_rate"] = _eval_miniwob(config, out, policy)
    return more

  actor, options = {"test": _policy_dir(workdir, k)}, dict(env_spec=env_spec(config), judge=_judge(config))
  r = evaluate_actors(config, actor, _queries(workdir, "test"), out, extra=extra, **options)["test"]
  control = evaluate_control(config, actor, workdir, out, **options)
  if control:  # the benchmark's negative control, which no iteration should move
    r["control_success_rate"] = control["control"]["test"]["success_rate"]
  return {"test_success_rate": r.pop("success_rate"), **r}


def _eval_miniwob(config, out, policy) -> float:
  """The policy on a few MiniWoB++ episodes (out of domain for the sites-trained policy); success = the task's
  raw reward 1."""
  tasks = miniwob.suite(names(config.eval.miniwob), seeds=range(int(config.eval.miniwob_seeds)),
                        max_steps=int(config.tasks.max_steps), split="test")
  spec = {"kind": "jaxagent.envs.miniwob:MiniWoBEnv", "observation": "a11y", "a11y_keep_unnamed": ["textbox"]}
  trajs = rollout.rollout(spec, config.env, policy, tasks, os.path.join(out, "miniwob"), judge=None,
                          name="miniwob_eval")
  return sum(t.trajectory_reward >= 1.0 for t in trajs) / len(tasks)


# ---------------------------------------------------------------------------------------- results


def collect_results(config, summaries: dict) -> dict:
  rows = []
  for k in range(int(config.iterations) + 1):
    name = "il" if k == 0 else f"iter{k}"
    ev = summaries[f"{name}/eval"]
    row = {"stage": name, "test_success_rate": ev["test_success_rate"], "episodes": ev["episodes"],
           "miniwob_success_rate": ev.get("miniwob_success_rate")}
    if "control_success_rate" in ev:  # the benchmark's negative control
      row["control_success_rate"] = ev["control_success_rate"]
    if k:
      ex = summaries[f"iter{k}/explore"]
      row.update(explore_solved_rate=ex["solved_rate"], explore_first_attempt_rate=ex["first_attempt_rate"],
                 new_samples=ex["samples"], train_samples=summaries[f"iter{k}/train"]["samples"])
      if ex.get("judge"):
        row["judge_agreement"] = ex["judge"]["agreement"]
    rows.append(row)
  il, last = rows[0]["test_success_rate"], rows[-1]["test_success_rate"]
  return {"per_iteration": rows, "teacher_success": summaries["il/data"].get("teacher_success"),
          "held_out": summaries["held_out"],
          "last_minus_il_points": 100 * (last - il),
          "monotone": all(b["test_success_rate"] >= a["test_success_rate"] for a, b in zip(rows, rows[1:]))}


def training_intents(config, workdir) -> set[str]:
  """Every intent the run trains on: the teacher's IL queries and every iteration's exploration queries (a
  `released` teacher's folders are its own and are not checked)."""
  stages = ["il"] + [f"iter{k}" for k in range(1, int(config.iterations) + 1)]
  return {t.intent for name in stages for t in _queries(workdir, name)}


def held_out(config, workdir) -> bool:
  """Whether no test query's intent is among the training queries' (the protocol's held-out rule)."""
  return not {t.intent for t in _queries(workdir, "test")} & training_intents(config, workdir)


def results_table(results: dict) -> str:
  lines = ["stage   test success  episodes  explore solved (1st try)  new samples  miniwob"]
  for r in results["per_iteration"]:
    ex = (f"{r['explore_solved_rate']:7.1%} ({r['explore_first_attempt_rate']:5.1%})" if "explore_solved_rate" in r
          else " " * 15)
    mw = f"{r['miniwob_success_rate']:.1%}" if r.get("miniwob_success_rate") is not None else "-"
    lines.append(f"{r['stage']:<7} {r['test_success_rate']:12.1%}  {r['episodes']:8d}  {ex:>24}  "
                 f"{r.get('new_samples', ''):>11}  {mw:>7}")
  lines.append(f"last − IL: {results['last_minus_il_points']:+.1f} points; non-decreasing: {results['monotone']}")
  lines.append("held-out: the test intents are in no IL or exploration query" if results.get("held_out") else
               "NOT held-out: a test intent is among the training queries")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------- helpers


def env_spec(config, oracle_targets: bool = False) -> dict:
  """The desktop web profile with the accessibility-tree observation (the oracle's targets for the expert)."""
  return rollout.site_env("web", "a11y", config.tasks.seed, config.env, oracle_targets=oracle_targets)


def _rollouts(config, oracle_targets: bool = False) -> rollout.Rollouts:
  return rollout.Rollouts(env_spec(config, oracle_targets), config.env, bool(config.train.progress_bar))


def _queries(workdir, name):
  return read_tasks(os.path.join(workdir, "tasks", f"{name}.jsonl"))


def _judge(config):
  """The configured judge; beside an LLM judge the programmatic verdict is recorded for the agreement figure."""
  reference = None if config.judge.kind == "programmatic" else programmatic.programmatic_judge()
  return explore.ReferencedJudge(programmatic.make_judge(config.judge), reference)


def _agreement(config, trajs) -> dict:
  return {} if config.judge.kind == "programmatic" else {"judge": explore.agreement(list(trajs))}


def _policy_dir(workdir, k):
  return os.path.join(workdir, "il" if k == 0 else f"iter{k}", "train")
