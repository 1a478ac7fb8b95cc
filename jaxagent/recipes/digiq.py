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
  filtered_bc     the baseline: every step of the successful behaviour episodes, trained as the actor is
  eval            behaviour policy, IL actor, Filtered BC and Digi-Q actor on the same test episodes, whose
                  intents are in no training data unless `behaviour.splits` names test: `results.json`,
                  TensorBoard, a table, `viewer.html`
"""

from __future__ import annotations

import os

import numpy as np

from jaxagent.agents import autoui
from jaxagent.data.store import TrajectoryStore
from jaxagent.models.critic import CriticConfig
from jaxagent.pipeline import device, distributed, report, rollout
from jaxagent.pipeline.config import names, stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.evaluate import evaluate_actors, evaluate_control, summary, write_results
from jaxagent.pipeline.policy import inference_mesh, load_actor
from jaxagent.pipeline.stages import Stages, write_text
from jaxagent.pipeline.tasks import (TRAIN_SPLITS, check_split_keys, draw_episodes, suite, success_rate,
                                     test_episodes)
from jaxagent.proj.digiq import critic as critic_lib
from jaxagent.proj.digiq import data, represent, viewer
from jaxagent.rl.losses import AUTOUI_PROB_CLAMP
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train.losses import sequence_nll, weighted_token_nll

STAGES = ("tasks", "il", "behaviour", "candidates", "representation", "critic", "actor", "filtered_bc", "eval")
CHOICES = {
    "env.browser": ("chromium",),
    "model.kind": ("vlm", "autoui"),
    "parse": ("faithful", "lenient"),
    "demos.split": TRAIN_SPLITS,
    "representation.readout": ("generated", "prompt_last"),
    "critic.target_init": ("random", "copy"),
    "actor.normalize": ("all_states", "kept_tokens"),
    "critic.backup": ("dataset", "sample", "mean"),
    "critic.advantage_estimation": ("bellman", "mc"),
    "critic.learn_metric": ("regression", "classification"),
    "critic.text_encoder": ("bag_of_words", "pooler"),
    "actor.loss": ("best-of-n", "pg", "awr", "sft"),
    "actor.head_reduce": ("min", "max"),
}
LISTS = {"behaviour.splits": TRAIN_SPLITS + ("test",)}
# `--seeds` pairs each policy with the behaviour policy, and these as the paper compares them (policy, baseline)
PAIRS = (("digiq_actor", "filtered_bc_actor"), ("digiq_actor", "il_actor"), ("filtered_bc_actor", "il_actor"))


def check_config(config) -> None:
  """The rules across keys `pipeline.config.validate` cannot see (`jaxagent.main` calls it before any work):
  `train_c` is a split of the benchmark alone; the phone is read as a screenshot (`device.check_observation`)."""
  check_split_keys(config, ("demos.split", "behaviour.splits"))
  device.check_observation(config, text=False)


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "digiq", config)
  stages.run("tasks", lambda out: device.stage_tasks(config, out))
  stages.run("il", lambda out: device.stage_il(config, workdir, out, float(config.critic.gamma)))
  stages.run("behaviour", lambda out: stage_behaviour(config, workdir, out))
  stages.run("candidates", lambda out: stage_candidates(config, workdir, out))
  stages.run("representation", lambda out: stage_representation(config, workdir, out))
  stages.run("critic", lambda out: stage_critic(config, workdir, out))
  stages.run("actor", lambda out: stage_actor(config, workdir, out))
  stages.run("filtered_bc", lambda out: stage_filtered_bc(config, workdir, out))
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + results_table(results))
  print(stages.table())
  return results


# ------------------------------------------------------------------------------------------ stages


def behaviour_episodes(config, workdir):
  """Drawn from the test split alone, the behaviour episodes are the evaluation's (same seed, same ids), so the
  eval stage scores the behaviour policy on these rollouts (`behaviour_rollouts`)."""
  splits = names(config.behaviour.splits)
  tasks, n = [t for s in splits for t in suite(workdir, s)], int(config.behaviour.episodes)
  if splits == ["test"]:
    return draw_episodes(tasks, n, int(config.eval.seed), "eval")
  return draw_episodes(tasks, n, int(config.seed) + 1, "beh")


def stage_behaviour(config, workdir, out):
  actor = _actor(config, workdir, "il", config.behaviour.temperature, int(config.seed))
  trajs = _rollout(config, device.env_spec(config), actor, behaviour_episodes(config, workdir), os.path.join(out, "store"),
                   "il_actor@behaviour")
  return {"episodes": len(trajs), "success": success_rate(trajs), "steps": sum(len(t.steps) for t in trajs)}


def stage_candidates(config, workdir, out):
  src, trajs = device.read_store(workdir, "behaviour", "store")
  actor = _actor(config, workdir, "il", config.candidates.temperature, int(config.seed) + 2)
  with_cands = data.add_candidates(config.candidates, actor, trajs, src, os.path.join(out, "store"))
  cands = [c for t in with_cands for s in t.steps if s.candidates for c in s.candidates[1:]]
  return {"states": sum(1 for t in with_cands for s in t.steps if s.candidates), "n": int(config.candidates.n),
          "valid_fraction": float(np.mean([autoui.is_action_valid(c) for c in cands])) if cands else 0.0}


def stage_representation(config, workdir, out):
  store, trajs = device.read_store(workdir, "candidates", "store")
  items = represent.finetune_items(trajs, store, os.path.join(out, "sft"))
  rep_config = stage_config(config, config.representation, seed_offset=3)
  init = config.representation.hf_checkpoint or os.path.join(workdir, "il")
  if config.model.kind == "autoui":  # no VLM to fine-tune in an AutoUI actor: one of its own (the original's LLaVA)
    rep_config.model.update(kind="vlm", hf_checkpoint=config.representation.hf_checkpoint)
    init = None  # `representation.hf_checkpoint`'s weights (`model.hf_checkpoint` now), else a tiny VLM from scratch
  finetune(rep_config, os.path.join(out, "model"), items, init_from=init)
  rep = config.representation
  loaded = load_policy(os.path.join(out, "model"), mesh=inference_mesh(config))
  encoder = represent.Encoder(loaded, rep.batch, readout=str(rep.readout),
                              max_new_tokens=int(rep.max_new_tokens), temperature=float(rep.temperature),
                              seed=int(config.seed))
  cache = represent.extract(encoder, trajs, store)
  if distributed.is_main():  # every process extracted the same; one writes it
    np.savez(os.path.join(out, "reps.tmp.npz"), **cache)
    os.replace(os.path.join(out, "reps.tmp.npz"), os.path.join(out, "reps.npz"))
  labels = [it["conversations"][1]["value"] for it in items]
  return {"sft_samples": len(items), "yes_fraction": labels.count("Yes") / len(labels),
          "pairs": int(cache["reps"].shape[0] * cache["reps"].shape[1]), "rep_dim": int(cache["reps"].shape[-1])}


def stage_critic(config, workdir, out):
  """Trains on the rows of all but the `critic.val_fraction` held-out trajectories and reports the same TD loss on
  the held-out rows (`digiq/algorithms/offpolicy_train_loop.py`); scores every row's candidates into `scores.npz`
  with `held_out` [M] marking the validation rows, which the code's actor does not train on either."""
  _, trajs = device.read_store(workdir, "candidates", "store")
  cache = dict(np.load(os.path.join(workdir, "representation", "reps.npz")))
  c, stage = config.critic, stage_config(config, config.critic)
  cfg: CriticConfig = critic_lib.critic_config(config, cache)
  rows = critic_lib.transition_arrays(trajs, cache, cfg, float(c.gamma), frame_stack=bool(c.frame_stack))
  held_out = critic_lib.held_out_rows(cache["rows"], float(c.val_fraction), int(stage.seed))
  critic = critic_lib.train_critic(stage, out, critic_lib.take_rows(rows, ~held_out), cfg)
  val = (critic_lib.log_validation(stage, out, critic, critic_lib.take_rows(rows, held_out)) if held_out.any()
         else None)
  q, v = critic_lib.score_candidates(critic.online, rows)
  if distributed.is_main():
    np.savez(os.path.join(out, "scores.tmp.npz"), q=q, v=v, rows=cache["rows"], valid=rows["valid"],
             held_out=held_out)
    os.replace(os.path.join(out, "scores.tmp.npz"), os.path.join(out, "scores.npz"))
  succ = np.asarray([trajs[i].success == 1.0 for i, _ in cache["rows"]])  # does V rank states by outcome?
  vmax = v.max(-1)
  return {"rows": int(len(q)), "train_rows": int((~held_out).sum()), "held_out_rows": int(held_out.sum()),
          "held_out_trajectories": int(len(np.unique(cache["rows"][held_out, 0]))),
          "val_loss": val["loss"] if val else None,
          "v_success": float(vmax[succ].mean()) if succ.any() else None,
          "v_failure": float(vmax[~succ].mean()) if (~succ).any() else None}


def stage_actor(config, workdir, out):
  """Best-of-N extraction (§5.5). `actor.normalize=all_states` trains as the code does: every scored state is a
  sample (weight 0 where no candidate cleared the threshold), and the loss is −mean_b w_b Σ_t log clip(p, 0.001,
  0.99) (`digiq/algorithms/digiq/trainer.py:actor_loss`); `kept_tokens` keeps only the weighted states and
  normalises per token, without the clamp."""
  store, trajs = device.read_store(workdir, "candidates", "store")
  scores = dict(np.load(os.path.join(workdir, "critic", "scores.npz")))
  # The critic's training trajectories only, as `trainer.py:update_policy` reads the training buffer alone.
  train = ~scores["held_out"] if "held_out" in scores else np.ones(len(scores["rows"]), bool)
  scores = {k: v[train] for k, v in scores.items()}
  idx, adv, weight = critic_lib.best_of_n(config.actor, scores)
  every_state = config.actor.normalize == "all_states"
  picks = [(i, k, trajs[i].steps[k].candidates[int(idx[r])], weight[r])
           for r, (i, k) in enumerate(scores["rows"]) if every_state or weight[r] > 0]
  kept = int((weight > 0).sum())
  summary = {"states": int(len(idx)), "kept": kept, "picked_non_dataset": int((idx[weight > 0] != 0).sum()),
             "mean_adv": float(adv.mean()), "held_out_states": int((~train).sum())}
  if not kept:
    summary["note"] = "no candidate cleared the threshold; the Digi-Q actor equals the IL actor"
    return summary
  items = device.state_samples(store, trajs, picks, os.path.join(out, "images"))
  summary["trained_on"] = len(items)
  summary["il_samples"] = _train_from_il(config, workdir, out, items)
  return summary


def stage_filtered_bc(config, workdir, out):
  """Filtered BC (the Digi-Q paper's baseline, §5.8): every step of the successful behaviour episodes, trained
  from the IL actor with the actor's stage block, loss and demonstrations, so that the two actors differ only in
  which (state, action) pairs they imitate."""
  store, trajs = device.read_store(workdir, "behaviour", "store")
  items = data.filtered_bc_samples(store, trajs, os.path.join(out, "images"))
  return {"filtered_bc_samples": len(items), "il_samples": _train_from_il(config, workdir, out, items)}


def _train_from_il(config, workdir, out, items) -> int:
  """The actor stage's training from the IL actor (stage block, loss by `actor.normalize`, demonstrations at
  `actor.il_weight`), shared by Best-of-N and Filtered BC; returns the demonstration samples added."""
  loss = sequence_nll(AUTOUI_PROB_CLAMP) if config.actor.normalize == "all_states" else weighted_token_nll
  return device.finetune_with_demos(actor_config(config), workdir, out, items, float(config.actor.il_weight),
                                    os.path.join(workdir, "il"), loss)


def behaviour_rollouts(config, workdir):
  """The behaviour stage's trajectories of the evaluation's episodes, in their order; None unless it ran every
  one of them. The behaviour policy is fixed, so its rollouts there score it as a fresh evaluation would."""
  by_id = rollout.stored_by_id(TrajectoryStore(os.path.join(workdir, "behaviour", "store")))
  episodes = test_episodes(config, workdir)
  if not all(t.id in by_id for t in episodes):
    return None
  return [by_id[t.id] for t in episodes]


def stage_eval(config, workdir, out):
  """IL, Filtered BC and Digi-Q's actors on the test episodes at `eval.temperature`; the behaviour policy (the IL
  actor at `behaviour.temperature`) on its own rollouts of them when it ran them all."""
  trained = lambda stage: os.path.join(workdir, stage if os.path.isdir(os.path.join(workdir, stage, "checkpoints"))
                                       else "il")
  tasks, spec, gamma = test_episodes(config, workdir), device.env_spec(config), float(config.critic.gamma)
  actors = {"il_actor": trained("il"), "filtered_bc_actor": trained("filtered_bc"), "digiq_actor": trained("actor")}
  temperatures = {"behaviour": float(config.behaviour.temperature), **dict.fromkeys(actors, config.eval.temperature)}
  reused = behaviour_rollouts(config, workdir)
  if reused is None:  # one scheduling of all four
    results = evaluate_actors(config, {"behaviour": trained("il"), **actors}, tasks, out, env_spec=spec, gamma=gamma,
                              temperature=temperatures)
  else:
    results = {"behaviour": {**summary(reused, config.behaviour.temperature), "rollouts": "behaviour stage"},
               **evaluate_actors(config, actors, tasks, out, env_spec=spec, gamma=gamma, temperature=temperatures)}
  results.update(evaluate_control(config, actors, workdir, out, env_spec=spec, gamma=gamma))
  results["digiq_minus_il"] = results["digiq_actor"]["success_rate"] - results["il_actor"]["success_rate"]
  results["digiq_minus_filtered_bc"] = (results["digiq_actor"]["success_rate"]
                                        - results["filtered_bc_actor"]["success_rate"])
  results["held_out"] = held_out(config, workdir)
  write_results(os.path.join(workdir, "results.json"), results)
  if distributed.is_main():
    store, trajs = device.read_store(workdir, "candidates", "store")
    pick = next((i for i, t in enumerate(trajs) if t.success == 1.0), 0)  # show a success if there is one
    scores = viewer.scores_for(dict(np.load(os.path.join(workdir, "critic", "scores.npz"))), pick)
    write_text(os.path.join(workdir, "viewer.html"), viewer.render_html(trajs[pick], store.load_image, scores))
  return results


def training_intents(config, workdir) -> set[str]:
  """Every intent the run trained on: the demonstrations' and the behaviour data's (candidates, representation,
  critic, actor and Filtered BC all read the behaviour episodes)."""
  return {t.intent for t in device.demo_tasks(config, workdir) + behaviour_episodes(config, workdir)}


def held_out(config, workdir) -> bool:
  """Whether the evaluation's intents appear in no training data of the run (the protocol's held-out rule)."""
  return not {t.intent for t in test_episodes(config, workdir)} & training_intents(config, workdir)


def results_table(results: dict) -> str:
  rows = report.policy_table(results, ("behaviour", "il_actor", "filtered_bc_actor", "digiq_actor"), PAIRS).split("\n")
  if "rollouts" in results["behaviour"]:
    rows.append(f"(behaviour: scored on the {results['behaviour']['rollouts']}'s rollouts of these episodes)")
  rows.append("held-out: the evaluation's intents are in no training data" if results["held_out"] else
              "NOT held-out: the evaluation's intents are in the training data (behaviour.splits names test)")
  return "\n".join(rows)


# ---------------------------------------------------------------------------------------- helpers


def _rollout(config, spec, policy, tasks, store_dir, name):
  return device.rollout(config, spec, policy, tasks, store_dir, name, gamma=float(config.critic.gamma))


def actor_config(config):
  return stage_config(config, config.actor, seed_offset=4)


def _actor(config, workdir, stage, temperature, seed):
  return load_actor(config, os.path.join(workdir, stage), temperature, seed)
