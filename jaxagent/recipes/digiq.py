"""Digi-Q end to end (`reference/algorithms.md` §5): `python -m jaxagent.main --config=configs/digiq.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished
stages and resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints):

  tasks           the device-profile (phone, AitW action space) suites of the chosen families
  il              the scripted expert's demonstrations in AutoUI format → the tiny VLM trained on them
  behaviour       the IL actor sampled at `behaviour.temperature` on the `behaviour.splits` tasks, judged
                  (terminal reward 1); on the test split alone, the evaluation's own episodes
  candidates      N−1 more actions per state from the actor (temperature 1.2, invalid ones resampled ≤ 3×),
                  the dataset action first, in `Step.candidates` (§5.1 step 4)
  representation  the VLM fine-tuned on "does this action change the screen" (§5.2), then every
                  (state, candidate) encoded once and cached in `reps.npz`
  critic          double Q/V on the frozen representations + text/image features, TD with a target critic
                  (§5.3–5.4); all candidates scored (`scores.npz`)
  actor           Best-of-N extraction (§5.5): the argmax candidate where Q − V > threshold, trained from the
                  IL actor (`pg`, `awr`, `sft` weightings as options)
  eval            behaviour policy, IL actor and Digi-Q actor on the test split (same episodes, fixed seed; the
                  behaviour policy scored on the behaviour stage's rollouts when those are the same episodes):
                  `<workdir>/results.json`, TensorBoard, a table; `<workdir>/viewer.html`
"""

from __future__ import annotations

import os

import numpy as np

from jaxagent.data.store import TrajectoryStore
from jaxagent.recipes.digiq_stages import common
from jaxagent.recipes.digiq_stages import data as data_lib
from jaxagent.train.metrics import MetricWriter

STAGES = ("tasks", "il", "behaviour", "candidates", "representation", "critic", "actor", "eval")


def build_model(config, tokenizer):
  """(model_fn, FLOPs per token, image tokens per image, preprocessing) of the VLM (`recipes.il.build_model`):
  lets `serving.load_policy` rebuild this recipe's checkpoints."""
  return common.build_vlm(config, tokenizer)[0]


def _tasks(config, workdir):
  return {split: data_lib.read_tasks(os.path.join(workdir, "tasks", f"{split}.jsonl")) for split in ("train", "test")}


def _il_config(config):
  return common.sub_config(config, steps=config.il.steps, batch_size=config.il.batch_size, lr=config.il.lr)


# ------------------------------------------------------------------------------------------ stages


def stage_tasks(config, workdir, out):
  return data_lib.write_tasks(out, data_lib.select_tasks(config))


def _demo_samples(workdir):
  """The IL stage's samples (the scripted expert's successful demonstration steps, images under il/images)."""
  store = TrajectoryStore(os.path.join(workdir, "il", "demos"))
  trajs = [store.read(i) for i in range(len(store))]
  return data_lib.step_samples(trajs, store, os.path.join(workdir, "il", "images"))


def stage_il(config, workdir, out):
  train = _tasks(config, workdir)["train"]
  demo_tasks = data_lib.episodes(train, int(config.demos.episodes), int(config.seed), "demo")
  trajs = data_lib.expert_rollout(config, os.path.join(out, "demos"), demo_tasks)
  items = _demo_samples(workdir)
  if not items:
    raise RuntimeError("the scripted expert solved no demonstration task; check the sites and the browser")
  common.train_vlm(_il_config(config), out, items)
  return {"demos": len(trajs), "expert_success": common.success_rate(trajs), "samples": len(items)}


def _split_names(config) -> list[str]:
  return [s.strip() for s in str(config.behaviour.splits).split(",") if s.strip()]


def behaviour_tasks(config, workdir):
  """The tasks the behaviour episodes are drawn from: the splits named in `behaviour.splits`."""
  suites = _tasks(config, workdir)
  splits = _split_names(config)
  if not splits or set(splits) - set(suites):
    raise ValueError(f"config.behaviour.splits={config.behaviour.splits!r}: name one or more of {sorted(suites)}, "
                     "comma-separated (e.g. 'train,test')")
  return [t for s in splits for t in suites[s]]


def behaviour_episodes(config, workdir):
  """The behaviour stage's episodes. Drawn from the test split alone, they are drawn as the evaluation draws its
  own (`eval.seed`, the same ids), so with `behaviour.episodes >= eval.episodes` they contain every evaluation
  episode and the eval stage scores the behaviour policy on these rollouts (`behaviour_rollouts`)."""
  tasks, n = behaviour_tasks(config, workdir), int(config.behaviour.episodes)
  if _split_names(config) == ["test"]:
    return data_lib.episodes(tasks, n, int(config.eval.seed), "eval")
  return data_lib.episodes(tasks, n, int(config.seed) + 1, "beh")


def stage_behaviour(config, workdir, out):
  tasks = behaviour_episodes(config, workdir)
  actor = common.load_actor(os.path.join(workdir, "il"), _il_config(config), config.behaviour.temperature,
                            seed=int(config.seed))
  trajs = common.rollout(config, os.path.join(out, "store"), actor, tasks, "il_actor@behaviour")
  return {"episodes": len(trajs), "success": common.success_rate(trajs),
          "steps": sum(len(t.steps) for t in trajs)}


def stage_candidates(config, workdir, out):
  src = TrajectoryStore(os.path.join(workdir, "behaviour", "store"))
  trajs = [src.read(i) for i in range(len(src))]
  actor = common.load_actor(os.path.join(workdir, "il"), _il_config(config), config.candidates.temperature,
                            seed=int(config.seed) + 2)
  with_cands = data_lib.add_candidates(config, actor, trajs, src, os.path.join(out, "store"))
  from jaxagent.agents import autoui  # pylint: disable=g-import-not-at-top
  cands = [c for t in with_cands for s in t.steps if s.candidates for c in s.candidates[1:]]
  return {"states": sum(1 for t in with_cands for s in t.steps if s.candidates), "n": int(config.candidates.n),
          "valid_fraction": float(np.mean([autoui.is_action_valid(c) for c in cands])) if cands else 0.0}


def _rep_config(config):
  return common.sub_config(config, steps=config.representation.steps, batch_size=config.representation.batch_size,
                           lr=config.representation.lr, seed_offset=3)


def stage_representation(config, workdir, out):
  from jaxagent.recipes.digiq_stages import represent  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  rcfg = _rep_config(config)
  init = config.representation.hf_checkpoint or os.path.join(workdir, "il")
  items = represent.finetune_items(trajs, store, os.path.join(out, "sft"))
  common.train_vlm(rcfg, os.path.join(out, "model"), items, init_from=init)
  encoder = represent.Encoder(load_policy(os.path.join(out, "model"), config=rcfg), config.representation.batch)
  cache = represent.extract(encoder, trajs, store)
  np.savez(os.path.join(out, "reps.tmp.npz"), **cache)
  os.replace(os.path.join(out, "reps.tmp.npz"), os.path.join(out, "reps.npz"))
  labels = [it["conversations"][1]["value"] for it in items]
  return {"sft_samples": len(items), "yes_fraction": labels.count("Yes") / len(labels),
          "pairs": int(cache["reps"].shape[0] * cache["reps"].shape[1]), "rep_dim": int(cache["reps"].shape[-1])}


def _critic_config(config, cache):
  from jaxagent.models.critic import CriticConfig  # pylint: disable=g-import-not-at-top
  c = config.critic
  return CriticConfig(text_dim=int(c.text_dim), image_dim=int(cache["image"].shape[-1]),
                      rep_dim=int(cache["reps"].shape[-1]), out_dim=1 if c.learn_metric == "regression" else 2,
                      text_encoder=str(c.text_encoder), point_octaves=int(c.point_octaves))


def stage_critic(config, workdir, out):
  from jaxagent.recipes.digiq_stages import critic as critic_stage  # pylint: disable=g-import-not-at-top
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  cache = dict(np.load(os.path.join(workdir, "representation", "reps.npz")))
  cfg = _critic_config(config, cache)
  data = critic_stage.transition_arrays(trajs, cache, cfg, float(config.critic.gamma))
  writer = MetricWriter(out)
  critic = critic_stage.train_critic(config, data, cfg, writer)
  writer.close()
  critic_stage.save_params(critic, os.path.join(out, "critic.npz"))
  q, v = critic_stage.score_candidates(critic, data)
  np.savez(os.path.join(out, "scores.tmp.npz"), q=q, v=v, rows=cache["rows"], valid=data["valid"])
  os.replace(os.path.join(out, "scores.tmp.npz"), os.path.join(out, "scores.npz"))
  # How well V ranks states: mean V of states on successful vs failed trajectories.
  succ = np.asarray([trajs[i].success == 1.0 for i, _ in cache["rows"]])
  vmax = v.max(-1)
  return {"rows": int(len(q)), "v_success": float(vmax[succ].mean()) if succ.any() else None,
          "v_failure": float(vmax[~succ].mean()) if (~succ).any() else None}


def best_of_n(config, scores: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(chosen candidate, its advantage, its actor weight) per scored state (§5.5) under `config.actor`."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jaxagent.rl import losses  # pylint: disable=g-import-not-at-top
  a = config.actor
  idx, adv = losses.best_of_n_select(jnp.asarray(scores["q"]), jnp.asarray(scores["v"]),
                                     jnp.asarray(scores["valid"]), str(a.head_reduce), True)
  weight = losses.best_of_n_weights(adv, str(a.loss), float(a.threshold), float(a.pg_multiplier),
                                    float(a.awr_beta))
  idx, adv, weight = np.asarray(idx), np.asarray(adv), np.asarray(weight)
  if not np.all(np.isfinite(weight)):  # awr's exp(A / β): e^88.7 is float32's largest
    raise ValueError(f"actor.loss={a.loss!r} with actor.awr_beta={a.awr_beta} gives infinite weights: exp(A / β) "
                     f"overflows float32 for advantages above {88.7 * float(a.awr_beta):.3f} (the largest here is "
                     f"{float(adv.max()):.3f}); raise actor.awr_beta")
  return idx, adv, weight


def stage_actor(config, workdir, out):
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  s = dict(np.load(os.path.join(workdir, "critic", "scores.npz")))
  a = config.actor
  idx, adv, weight = best_of_n(config, s)
  picks = [(i, k, trajs[i].steps[k].candidates[int(idx[r])], weight[r])
           for r, (i, k) in enumerate(s["rows"]) if weight[r] > 0]
  items = state_items(store, trajs, picks, os.path.join(out, "images"))
  summary = {"states": int(len(idx)), "trained_on": len(items), "picked_non_dataset": int((idx[weight > 0] != 0).sum()),
             "mean_adv": float(adv.mean())}
  if not items:  # no state's best candidate clears the threshold: the extracted actor is the IL actor
    summary["note"] = "no candidate cleared the threshold; the Digi-Q actor equals the IL actor"
    return summary
  if float(a.il_weight) > 0:  # the demonstrations stay in the mix (see configs/digiq.py: actor.il_weight)
    il_items = demo_items(config, workdir)
    items += il_items
    summary["il_samples"] = len(il_items)
  common.train_vlm(actor_config(config), out, items, init_from=os.path.join(workdir, "il"))
  return summary


def state_items(store, trajs, picks, image_dir: str) -> list[dict]:
  """Actor samples from dataset states: for each pick (trajectory i, step k, action string, weight) the state's
  1/4 screenshot (written under `image_dir`), its AutoUI prompt and that action."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for i, k, action, weight in picks:
    step = trajs[i].steps[k]
    image = common.small_screen(store.load_image(step.image_path))
    path = common.save_png(os.path.join(image_dir, f"{i}-{k}.png"), image)
    items.append(common.sample_item(f"{i}-{k}", path, step.obs_text, action, weight))
  return items


def filtered_bc_items(workdir, out) -> list[dict]:
  """The paper's Filtered BC baseline (§5.8, "AutoUI + Filtered BC"): every step of the successful behaviour
  trajectories with its dataset action, weight 1."""
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  picks = [(i, k, step.action_text, 1.0) for i, t in enumerate(trajs) if t.success == 1.0
           for k, step in enumerate(t.steps) if step.image_path]
  return state_items(store, trajs, picks, os.path.join(out, "images"))


def demo_items(config, workdir):
  """The demonstrations as actor samples weighted `actor.il_weight`."""
  items = _demo_samples(workdir)
  for it in items:
    it["weight"] = float(config.actor.il_weight)
  return items


def actor_config(config):
  """The Digi-Q actor's training (and reloading) config."""
  a = config.actor
  return common.sub_config(config, steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed_offset=4)


def test_episodes(config, workdir):
  """The evaluation's episodes: `eval.episodes` draws from the test split with the fixed `eval.seed`."""
  return data_lib.episodes(_tasks(config, workdir)["test"], int(config.eval.episodes), int(config.eval.seed), "eval")


def evaluate(config, workdir, store_dir, name, model_dir, model_config, temperature) -> dict:
  """Rolls the actor saved in `model_dir` out on the test episodes into `store_dir`; its success rate etc."""
  actor = common.load_actor(model_dir, model_config, temperature, seed=int(config.eval.seed))
  return _eval_summary(common.rollout(config, store_dir, actor, test_episodes(config, workdir), name), temperature)


def _eval_summary(trajs, temperature: float) -> dict:
  return {"success_rate": common.success_rate(trajs), "episodes": len(trajs), "temperature": temperature,
          "mean_steps": float(np.mean([len(t.steps) for t in trajs]))}


def behaviour_rollouts(config, workdir):
  """The behaviour stage's trajectories of the evaluation's episodes, in their order; None unless it ran every
  one of them (`behaviour_episodes`). The behaviour policy is fixed, so its rollouts there score it as a fresh
  evaluation would, and the eval stage need not run those episodes a second time."""
  store = TrajectoryStore(os.path.join(workdir, "behaviour", "store"))
  by_id = {store.read_json(i)["task"]["id"]: i for i in range(len(store))}
  episodes = test_episodes(config, workdir)
  if not all(t.id in by_id for t in episodes):
    return None
  return [store.read(by_id[t.id]) for t in episodes]


def stage_eval(config, workdir, out):
  il_dir, actor_dir = os.path.join(workdir, "il"), os.path.join(workdir, "actor")
  actor_src = actor_dir if os.path.isdir(os.path.join(actor_dir, "checkpoints")) else il_dir
  policies = {
      "behaviour": (il_dir, _il_config(config), float(config.behaviour.temperature)),
      "il_actor": (il_dir, _il_config(config), float(config.eval.temperature)),
      "digiq_actor": (actor_src, actor_config(config), float(config.eval.temperature)),
  }
  results = {}
  reused = behaviour_rollouts(config, workdir)
  writer = MetricWriter(out)
  for n, (name, (path, cfg, temperature)) in enumerate(policies.items()):
    if name == "behaviour" and reused is not None:
      results[name] = {**_eval_summary(reused, temperature), "rollouts": "behaviour stage"}
    else:
      results[name] = evaluate(config, workdir, os.path.join(out, name), name, path, cfg, temperature)
    writer.write_scalars(n, {f"eval/{name}_success_rate": results[name]["success_rate"]})
  writer.close()
  results["digiq_minus_behaviour"] = results["digiq_actor"]["success_rate"] - results["behaviour"]["success_rate"]
  common.write_json(os.path.join(workdir, "results.json"), results)
  _write_viewer(workdir)
  return results


def _write_viewer(workdir):
  """`<workdir>/viewer.html`: the first behaviour trajectory with candidates ranked by Q (a success if any)."""
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from data_tools import view_trajectory  # pylint: disable=g-import-not-at-top
  store = TrajectoryStore(os.path.join(workdir, "candidates", "store"))
  trajs = [store.read(i) for i in range(len(store))]
  pick = next((i for i, t in enumerate(trajs) if t.success == 1.0), 0)
  scores = view_trajectory.scores_for(dict(np.load(os.path.join(workdir, "critic", "scores.npz"))), pick)
  with open(os.path.join(workdir, "viewer.html"), "w", encoding="utf-8") as f:
    f.write(view_trajectory.render_html(trajs[pick], store.load_image, scores))


# ------------------------------------------------------------------------------------------ driver


def run(config, workdir: str) -> dict:
  timer = common.Timer(workdir)
  fns = {"tasks": stage_tasks, "il": stage_il, "behaviour": stage_behaviour, "candidates": stage_candidates,
         "representation": stage_representation, "critic": stage_critic, "actor": stage_actor, "eval": stage_eval}
  summaries = {}
  for name in STAGES:
    summaries[name] = common.run_stage(workdir, name, lambda out, f=fns[name]: f(config, workdir, out), timer)
  results = summaries["eval"]
  print("\n" + results_table(results))
  print(timer.table())
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

