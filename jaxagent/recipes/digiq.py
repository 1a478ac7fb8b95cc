"""Digi-Q end to end (`reference/algorithms.md` §5): `python -m jaxagent.main --config=configs/digiq.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished
stages and resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints):

  tasks           the phone-profile (AitW action space) suites of the chosen families
  il              the scripted expert's demonstrations in AutoUI format → the VLM trained on them
  behaviour       the IL actor sampled at `behaviour.temperature` on the `behaviour.splits` tasks, judged
                  (terminal reward 1); on the test split alone, the evaluation's own episodes
  candidates      N−1 more actions per state from the actor, the dataset action first (§5.1 step 4)
  representation  the VLM fine-tuned on "does this action change the screen" (§5.2), then every
                  (state, candidate) encoded once into `reps.npz`
  critic          double Q/V on the frozen representations, TD with a Polyak target (§5.3–5.4); every
                  candidate scored into `scores.npz`
  actor           Best-of-N extraction (§5.5): the best candidate where Q − V > threshold, trained from the IL actor
  eval            behaviour policy, IL actor and Digi-Q actor on the same test episodes: `results.json`,
                  TensorBoard, a table, `viewer.html`
"""

from __future__ import annotations

import os

import numpy as np

from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.models.critic import CriticConfig
from jaxagent.pipeline import device
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.stages import Stages, write_json, write_text
from jaxagent.pipeline.tasks import draw_episodes, success_rate
from jaxagent.proj.digiq import critic as critic_lib
from jaxagent.proj.digiq import data, represent, viewer
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train.metrics import MetricWriter

STAGES = ("tasks", "il", "behaviour", "candidates", "representation", "critic", "actor", "eval")
CHOICES = {
    "model.kind": ("vlm",),
    "critic.backup": ("dataset", "sample", "mean"),
    "critic.advantage_estimation": ("bellman", "mc"),
    "critic.learn_metric": ("regression", "classification"),
    "critic.text_encoder": ("bag_of_words", "pooler"),
    "actor.loss": ("best-of-n", "pg", "awr", "sft"),
    "actor.head_reduce": ("min", "max"),
}
LISTS = {"behaviour.splits": ("train", "test")}


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "digiq", config)
  stages.run("tasks", lambda out: device.stage_tasks(config, out))
  stages.run("il", lambda out: device.stage_il(config, workdir, out, float(config.critic.gamma)))
  stages.run("behaviour", lambda out: stage_behaviour(config, workdir, out))
  stages.run("candidates", lambda out: stage_candidates(config, workdir, out))
  stages.run("representation", lambda out: stage_representation(config, workdir, out))
  stages.run("critic", lambda out: stage_critic(config, workdir, out))
  stages.run("actor", lambda out: stage_actor(config, workdir, out))
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + results_table(results))
  print(stages.table())
  return results


# ---------------------------------------------------------------------------------------- helpers


def _rollout(config, spec, policy, tasks, store_dir, name):
  return device.rollout(config, spec, policy, tasks, store_dir, name, gamma=float(config.critic.gamma))


def _suite(workdir, split):
  return device.suite(workdir, split)


def _store(workdir, *parts):
  return device.read_store(workdir, *parts)


def actor_config(config):
  return stage_config(config, config.actor, seed_offset=4)


def _actor(config, workdir, stage, temperature, seed):
  return device.load_actor(config, os.path.join(workdir, stage), temperature, seed)


# ------------------------------------------------------------------------------------------ stages


def behaviour_episodes(config, workdir):
  """Drawn from the test split alone, the behaviour episodes are the evaluation's (same seed, same ids), so the
  eval stage scores the behaviour policy on these rollouts (`behaviour_rollouts`)."""
  splits = [s.strip() for s in config.behaviour.splits.split(",") if s.strip()]
  tasks, n = [t for s in splits for t in _suite(workdir, s)], int(config.behaviour.episodes)
  if splits == ["test"]:
    return draw_episodes(tasks, n, int(config.eval.seed), "eval")
  return draw_episodes(tasks, n, int(config.seed) + 1, "beh")


def stage_behaviour(config, workdir, out):
  actor = _actor(config, workdir, "il", config.behaviour.temperature, int(config.seed))
  trajs = _rollout(config, device.env_spec(config), actor, behaviour_episodes(config, workdir), os.path.join(out, "store"),
                   "il_actor@behaviour")
  return {"episodes": len(trajs), "success": success_rate(trajs), "steps": sum(len(t.steps) for t in trajs)}


def stage_candidates(config, workdir, out):
  src, trajs = _store(workdir, "behaviour", "store")
  actor = _actor(config, workdir, "il", config.candidates.temperature, int(config.seed) + 2)
  with_cands = data.add_candidates(config.candidates, actor, trajs, src, os.path.join(out, "store"))
  cands = [c for t in with_cands for s in t.steps if s.candidates for c in s.candidates[1:]]
  return {"states": sum(1 for t in with_cands for s in t.steps if s.candidates), "n": int(config.candidates.n),
          "valid_fraction": float(np.mean([autoui.is_action_valid(c) for c in cands])) if cands else 0.0}


def stage_representation(config, workdir, out):
  store, trajs = _store(workdir, "candidates", "store")
  items = represent.finetune_items(trajs, store, os.path.join(out, "sft"))
  init = config.representation.hf_checkpoint or os.path.join(workdir, "il")
  finetune(stage_config(config, config.representation, seed_offset=3), os.path.join(out, "model"), items,
           init_from=init)
  encoder = represent.Encoder(load_policy(os.path.join(out, "model")), config.representation.batch)
  cache = represent.extract(encoder, trajs, store)
  np.savez(os.path.join(out, "reps.tmp.npz"), **cache)
  os.replace(os.path.join(out, "reps.tmp.npz"), os.path.join(out, "reps.npz"))
  labels = [it["conversations"][1]["value"] for it in items]
  return {"sft_samples": len(items), "yes_fraction": labels.count("Yes") / len(labels),
          "pairs": int(cache["reps"].shape[0] * cache["reps"].shape[1]), "rep_dim": int(cache["reps"].shape[-1])}


def stage_critic(config, workdir, out):
  _, trajs = _store(workdir, "candidates", "store")
  cache = dict(np.load(os.path.join(workdir, "representation", "reps.npz")))
  cfg: CriticConfig = critic_lib.critic_config(config, cache)
  rows = critic_lib.transition_arrays(trajs, cache, cfg, float(config.critic.gamma))
  critic = critic_lib.train_critic(stage_config(config, config.critic), out, rows, cfg)
  q, v = critic_lib.score_candidates(critic.online, rows)
  np.savez(os.path.join(out, "scores.tmp.npz"), q=q, v=v, rows=cache["rows"], valid=rows["valid"])
  os.replace(os.path.join(out, "scores.tmp.npz"), os.path.join(out, "scores.npz"))
  succ = np.asarray([trajs[i].success == 1.0 for i, _ in cache["rows"]])  # does V rank states by outcome?
  vmax = v.max(-1)
  return {"rows": int(len(q)), "v_success": float(vmax[succ].mean()) if succ.any() else None,
          "v_failure": float(vmax[~succ].mean()) if (~succ).any() else None}


def stage_actor(config, workdir, out):
  store, trajs = _store(workdir, "candidates", "store")
  scores = dict(np.load(os.path.join(workdir, "critic", "scores.npz")))
  idx, adv, weight = critic_lib.best_of_n(config.actor, scores)
  picks = [(i, k, trajs[i].steps[k].candidates[int(idx[r])], weight[r])
           for r, (i, k) in enumerate(scores["rows"]) if weight[r] > 0]
  items = device.state_samples(store, trajs, picks, os.path.join(out, "images"))
  summary = {"states": int(len(idx)), "trained_on": len(items), "picked_non_dataset": int((idx[weight > 0] != 0).sum()),
             "mean_adv": float(adv.mean())}
  if not items:
    summary["note"] = "no candidate cleared the threshold; the Digi-Q actor equals the IL actor"
    return summary
  if float(config.actor.il_weight) > 0:
    demos = [dict(it, weight=float(config.actor.il_weight)) for it in device.demo_samples(workdir)]
    items += demos
    summary["il_samples"] = len(demos)
  finetune(actor_config(config), out, items, init_from=os.path.join(workdir, "il"))
  return summary


def test_episodes(config, workdir):
  """The evaluation's episodes: `eval.episodes` draws from the test split with the fixed `eval.seed`."""
  return draw_episodes(_suite(workdir, "test"), int(config.eval.episodes), int(config.eval.seed), "eval")


def evaluate(config, workdir, store_dir, name, model_dir, temperature) -> dict:
  """The actor saved in `model_dir` on the test episodes, into `store_dir`: its success rate etc."""
  actor = device.load_actor(config, model_dir, temperature, int(config.eval.seed))
  trajs = _rollout(config, device.env_spec(config), actor, test_episodes(config, workdir), store_dir, name)
  return device.eval_summary(trajs, temperature)


def behaviour_rollouts(config, workdir):
  """The behaviour stage's trajectories of the evaluation's episodes, in their order; None unless it ran every
  one of them. The behaviour policy is fixed, so its rollouts there score it as a fresh evaluation would."""
  store = TrajectoryStore(os.path.join(workdir, "behaviour", "store"))
  by_id = {store.read_json(i)["task"]["id"]: i for i in range(len(store))}
  episodes = test_episodes(config, workdir)
  if not all(t.id in by_id for t in episodes):
    return None
  return [store.read(by_id[t.id]) for t in episodes]


def stage_eval(config, workdir, out):
  actor_dir = os.path.join(workdir, "actor")
  policies = {"behaviour": ("il", config.behaviour.temperature), "il_actor": ("il", config.eval.temperature),
              "digiq_actor": ("actor" if os.path.isdir(os.path.join(actor_dir, "checkpoints")) else "il",
                              config.eval.temperature)}
  results, reused = {}, behaviour_rollouts(config, workdir)
  writer = MetricWriter(out)
  for name, (stage, temperature) in policies.items():
    if name == "behaviour" and reused is not None:
      results[name] = {**device.eval_summary(reused, temperature), "rollouts": "behaviour stage"}
    else:
      results[name] = evaluate(config, workdir, os.path.join(out, name), name, os.path.join(workdir, stage),
                               temperature)
    writer.write_scalars(0, {f"eval/{name}_success_rate": results[name]["success_rate"]})
  writer.close()
  results["digiq_minus_behaviour"] = results["digiq_actor"]["success_rate"] - results["behaviour"]["success_rate"]
  write_json(os.path.join(workdir, "results.json"), results)
  store, trajs = _store(workdir, "candidates", "store")
  pick = next((i for i, t in enumerate(trajs) if t.success == 1.0), 0)  # show a success if there is one
  scores = viewer.scores_for(dict(np.load(os.path.join(workdir, "critic", "scores.npz"))), pick)
  write_text(os.path.join(workdir, "viewer.html"), viewer.render_html(trajs[pick], store.load_image, scores))
  return results


def results_table(results: dict) -> str:
  rows = ["policy          success   episodes  temperature  mean steps"]
  for name in ("behaviour", "il_actor", "digiq_actor"):
    r = results[name]
    rows.append(f"{name:<15} {r['success_rate']:7.1%}   {r['episodes']:8d}  {r['temperature']:11.2f}  "
                f"{r['mean_steps']:10.2f}")
  if "rollouts" in results["behaviour"]:
    rows.append(f"(behaviour: scored on the {results['behaviour']['rollouts']}'s rollouts of these episodes)")
  rows.append(f"Digi-Q − behaviour: {results['digiq_minus_behaviour'] * 100:+.1f} points")
  return "\n".join(rows)
