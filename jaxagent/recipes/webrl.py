"""WebRL end to end (`reference/algorithms.md` §3): `python -m jaxagent.main --config=configs/webrl.py`.

Stages, in order (each writes `<workdir>/<stage>/` and a `DONE` marker; a restarted run skips finished stages and
resumes the running one: rollouts by episode id, trainings from their Orbax checkpoints, phases stage by stage):

  tasks     the bundled sites' text-profile suites: train tasks for every training episode, test tasks for the
            evaluation alone
  sft       the scripted expert's WebRL-format demonstrations → the text decoder fine-tuned on their successful
            steps (π_0, the original's SFT checkpoint; also the ORM's start and the critic's trunk)
  orm       π_0's rollouts on train tasks, judged by the sites' programs → the ORM trained to answer YES/NO on
            them and the demonstrations; its agreement with the judge on held-out episodes
  phase<t>  curriculum (tasks from phase t−1's failures, `proj.webrl.curriculum`: other parameters of their
            templates, or with `curriculum.generator=openai` what an LLM writes from them, less any test intent;
            through the critic filter)
            → rollouts of π_{t−1} (with `rollout.max_lag` L > 0: of π_{t−1−L}, collected while π_{t−1}
            trains) → ORM labels (the reward; the judge's verdict kept to measure the ORM)
            → critic (continues phase t−1's on this phase's steps and the replay) → actor π_t from π_{t−1}
            with π_ref = π_{t−1} on this phase's steps and the replayed successes (`proj.webrl.replay`)
  eval      π_0 and every phase's actor on the same held-out test episodes at `eval.temperature`:
            `results.json`, TensorBoard, a table

Every policy rollout (ORM data, phases, evaluation) ends early by VAB's rule (`config.early_stop`,
`agents.webrl.early_stop`). Generated tasks have no evaluator: the judge leaves them unjudged, so judge success
rates and the ORM's agreement count judged episodes only.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.agents.webrl import WebRL, current_html, early_stop
from jaxagent.data.store import TrajectoryStore
from jaxagent.data.tokenizer import fit_tokenizer
from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.pipeline import async_collect, device, distributed, report, rollout, scoring
from jaxagent.pipeline import tasks as tasks_lib
from jaxagent.pipeline.config import ConfigError, stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import inference_mesh, load_vlm_policy
from jaxagent.pipeline.stages import Stages, read_json, write_json
from jaxagent.pipeline.tasks import draw_episodes, success_rate
from jaxagent.proj.webrl import critic as critic_lib
from jaxagent.proj.webrl import curriculum, data, orm, replay
from jaxagent.serving.checkpoint import load_policy
from jaxagent.train.losses import webrl_actor_loss, webrl_actor_loss_paper, weighted_token_nll
from jaxagent.train.metrics import MetricWriter

CHOICES = {
    "env.browser": ("chromium", "text"),
    "model.kind": ("decoder",),
    "html": ("compact", "full"),
    "reward": ("orm", "judge"),
    "demos.split": ("train", "train_a", "train_b"),
    "actor.loss": ("code", "paper", "sft"),
    "curriculum.generator": ("variations", "openai"),
    "orm.held_out": orm.HELD_OUT,
}


def check_config(config) -> None:
  """The rules across keys `pipeline.config.validate` cannot see (`jaxagent.main` calls it before any work)."""
  if config.env.browser == "text" and config.html != "compact":
    raise ConfigError("config.env.browser='text' with config.html='full': the full HTML carries each element's "
                      "box (data-bbox), which only a browser lays out; set --config.html=compact or "
                      "--config.env.browser=chromium")
  if config.data.tokenizer == "demos" and config.model.hf_checkpoint:
    raise ConfigError(f"config.data.tokenizer='demos' fits a new vocabulary, which model.hf_checkpoint="
                      f"{config.model.hf_checkpoint!r}'s embeddings do not have; set --config.data.tokenizer='' "
                      "(the checkpoint's own tokenizer)")
  for stage, (key, least) in itertools.product(("sft", "orm"), (("steps", 0), ("prompt_chars", 1))):
    value = config[stage].warmup[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ConfigError(f"config.{stage}.warmup.{key}={value!r}: must be a whole number >= {least}; set "
                        f"--config.{stage}.warmup.{key}={200 if key == 'prompt_chars' else 0}")
  if isinstance(config.actor.epochs, bool) or not config.actor.epochs > 0:
    raise ConfigError(f"config.actor.epochs={config.actor.epochs!r}: must be > 0 (passes over a phase's samples at "
                      "most); set --config.actor.epochs=2")
  if config.curriculum.generator != "openai":
    return
  gen = config.curriculum.openai
  if not gen.base_url:
    raise ConfigError("config.curriculum.openai.base_url is required with curriculum.generator=openai; set "
                      "--config.curriculum.openai.base_url=http://HOST:PORT/v1 (any OpenAI-compatible endpoint)")
  for key in ("turns", "seeds"):
    if isinstance(gen[key], bool) or not isinstance(gen[key], int) or gen[key] < 1:
      raise ConfigError(f"config.curriculum.openai.{key}={gen[key]!r}: must be a whole number >= 1; set "
                        f"--config.curriculum.openai.{key}=1 (or more)")
  if config.reward == "judge":
    raise ConfigError("config.reward='judge' needs a verdict on every episode, and curriculum.generator=openai "
                      "writes tasks without an evaluator; set --config.reward=orm or "
                      "--config.curriculum.generator=variations")


def run(config, workdir: str) -> dict:
  check_config(config)
  stages = Stages(workdir, "webrl", config)
  stages.run("tasks", lambda out: tasks_lib.stage_tasks(config, out, "text"))
  stages.run("sft", lambda out: stage_sft(config, workdir, out))
  stages.run("orm", lambda out: stage_orm(config, workdir, out))
  n = int(config.phases)
  with async_collect.AsyncCollector(lambda i, actor: collect_phase(config, workdir, i + 1, actor), n,
                                    int(config.rollout.max_lag), gated=True,
                                    done=lambda i: phase_stages(config, workdir, i + 1).is_done("rollouts")
                                    ) as collector:
    collector.publish(0, phase_actor(workdir, 0))
    collector.allow(0)
    for t in range(1, n + 1):
      learn_phase(config, workdir, t, collector)
  results = stages.run("eval", lambda out: stage_eval(config, workdir, out))
  print("\n" + results_table(results))
  print(stages.table())
  return results


# ---------------------------------------------------------------------------------------- helpers


def format_options(config) -> dict:
  return {"compact": config.html == "compact", "max_prompt_chars": int(config.prompt_chars)}


def agent_format(config) -> WebRL:
  return WebRL(**format_options(config))


def env_spec(config, expert: bool = False) -> dict:
  """The desktop window on the bundled sites, observed as WebRL's simplified HTML (no screenshots)."""
  return rollout.site_env("text", "html", config.tasks.seed, config.env,
                          **({"oracle_targets": True} if expert else {}))


def _prompt_fn(fmt: WebRL):
  return lambda obs, history: ([{"from": "human", "value": fmt.build_prompt(obs.intent, obs, history)}], [])


def early_stop_rule(config):
  """`agents.webrl.early_stop` at `config.early_stop`'s thresholds; None when both are 0."""
  k = {"parse_failures": int(config.early_stop.parse_failures), "repeats": int(config.early_stop.repeats)}
  return functools.partial(early_stop, **k) if any(k.values()) else None


def _rollout(config, model_dir: str, temperature: float, tasks, store_dir: str, name: str, seed: int, meta=None):
  fmt = agent_format(config)
  actor = load_vlm_policy(model_dir, config, fmt, _prompt_fn(fmt), temperature, seed)
  return device.rollout(config, env_spec(config), actor, tasks, store_dir, name, gamma=data.GAMMA, meta=meta,
                        early_stop=early_stop_rule(config))


def _judged(trajs: Sequence[types.Trajectory]) -> list[types.Trajectory]:
  """The episodes with a programmatic verdict (a generated task has none)."""
  return [x for x in trajs if x.success is not None]


def _step_samples(trajs: Sequence[types.Trajectory]) -> list[dict]:
  return [data.sample(f"{t.task.id}-{s.step}", s.obs_text, s.action_text) for t in trajs for s in t.steps
          if s.obs_text and s.action_text]


def _scoring(config) -> dict:
  return {"batch": int(config.scoring.batch), "max_len": int(config.data.seq_len)}


def _demos(workdir: str) -> list[types.Trajectory]:
  return rollout.episodes(TrajectoryStore(os.path.join(workdir, "sft", "demos")))


# ------------------------------------------------------------------------------------------ stages


def stage_sft(config, workdir, out):
  """The expert's demonstrations on `demos.split` train tasks → π_0 trained on their successful steps."""
  tasks = draw_episodes(device.suite(workdir, config.demos.split), int(config.demos.episodes), int(config.seed),
                        "demo")
  trajs = device.rollout(config, env_spec(config, expert=True), ScriptedExpert("webrl", **format_options(config)),
                         tasks, os.path.join(out, "demos"), "scripted_expert:webrl", gamma=data.GAMMA)
  items = _step_samples([t for t in trajs if t.success == 1.0])
  if not items:
    raise RuntimeError("the scripted expert solved no demonstration task; check the sites and the browser")
  sft_config = stage_config(config, config.sft)
  if config.data.tokenizer == "demos":
    texts = [turn["value"] for it in items for turn in it["conversations"]]
    sft_config.data.tokenizer = fit_tokenizer(os.path.join(out, "fitted_tokenizer"), texts)
  start = _warmup(config, config.sft, sft_config.data.tokenizer, items, data.cut_html, os.path.join(out, "warmup"))
  finetune(sft_config, out, items, init_from=start)
  return {"demos": len(trajs), "expert_success": success_rate(trajs), "samples": len(items)}


def _warmup(config, section, tokenizer: str, items: list[dict], cut, out: str, init_from: str | None = None,
            seed_offset: int = 0) -> str | None:
  """A stage's start: `section.warmup.steps` steps on its samples with each page cut by `cut` to
  `section.warmup.prompt_chars` characters, from `init_from`; returns where the stage starts (`init_from` when off).

  A decoder trained from scratch learns to look from its reply back to the intent's words over ~100 tokens, and
  keeps doing so over the full ~750, where on full pages alone it does not learn it at all
  (docs/results/webrl.md#warmup): short inputs first, as Shortformer's staged training (Press et al., 2021)."""
  if int(section.warmup.steps) <= 0:
    return init_from
  chars = int(section.warmup.prompt_chars)
  short = [{**it, "conversations": [{**it["conversations"][0], "value": cut(it["conversations"][0]["value"], chars)},
                                    *it["conversations"][1:]]} for it in items]
  warm_config = stage_config(config, section, seed_offset=seed_offset, steps=int(section.warmup.steps))
  if tokenizer:
    warm_config.data.tokenizer = tokenizer
  finetune(warm_config, out, short, init_from=init_from)
  return out


def orm_episodes(config, workdir: str, out: str) -> tuple[list, list, list, list]:
  """The ORM's judged episodes on train tasks (run into `out`, or read back where they are): π_0's rollouts, the
  expert's near misses, and the (train, held-out) split of `orm.held_out` (`orm.split_held_out`). Returns
  (rollouts, near misses, train, held out)."""
  pool = device.suite(workdir, "train")
  tasks = draw_episodes(pool, int(config.orm.episodes), int(config.seed) + 1, "orm")
  trajs = [t for t in _rollout(config, os.path.join(workdir, "sft"), float(config.orm.temperature), tasks,
                               os.path.join(out, "store"), "sft@orm", int(config.seed)) if data.usable(t)]
  misses = orm.near_misses(draw_episodes(pool, int(config.orm.near_misses), int(config.seed) + 4, "miss"), pool,
                           int(config.seed) + 5)
  decoys = device.rollout(config, env_spec(config, expert=True), ScriptedExpert("webrl", **format_options(config)),
                          misses, os.path.join(out, "near_misses"), "scripted_expert:near_miss", gamma=data.GAMMA)
  judged = trajs + [t for t in decoys if data.usable(t)]
  train, val = orm.split_held_out(judged, [t for t in _demos(workdir) if data.usable(t)],
                                  float(config.orm.val_fraction), int(config.seed) + 2, config.orm.held_out)
  return trajs, decoys, train, val


def stage_orm(config, workdir, out):
  """π_0's judged rollouts on train tasks, the demonstrations and the expert's near misses → the ORM, initialised
  from π_0; its agreement with the judge on `orm.val_fraction` of the rollouts and near misses, held out."""
  trajs, decoys, train, val = orm_episodes(config, workdir, out)
  items = [orm.orm_sample(t, t.success == 1.0, f"orm-{i}") for i, t in enumerate(train)]
  held_out = train_orm(config, workdir, out, items, val)
  tasks_lib.write_tasks(os.path.join(out, "failed.jsonl"), [t.task for t in trajs if t.success != 1.0])
  return {"rollouts": len(trajs), "rollout_success": success_rate(trajs), "near_misses": len(decoys),
          "near_miss_success": success_rate(decoys), "train_episodes": len(train),
          "train_positive": sum(t.success == 1.0 for t in train), "held_out": held_out}


def train_orm(config, workdir: str, out: str, items: list[dict], val: Sequence[types.Trajectory],
              from_policy: bool = True) -> dict:
  """The ORM (`out/model`) fine-tuned on `items` (after its warm-up) from π_0, or with `from_policy=False` from
  `config.model.hf_checkpoint`'s weights (the original's ORM is a model of its own); its agreement with the judge
  on `val`."""
  start = _warmup(config, config.orm, "", items, orm.cut_screen, os.path.join(out, "warmup"),
                  init_from=os.path.join(workdir, "sft") if from_policy else None, seed_offset=3)
  finetune(stage_config(config, config.orm, seed_offset=3), os.path.join(out, "model"), items, init_from=start)
  loaded = load_policy(os.path.join(out, "model"), mesh=inference_mesh(config))
  probs = orm.probabilities(loaded, val, **_scoring(config))
  return orm.agreement(probs, [t.success for t in val])


def start_pages(workdir: str) -> dict[str, str]:
  """Each site's start page as the demonstrations first saw it (the critic filter's canonical HTML, as the
  original's `htmls.json`)."""
  pages = {}
  for t in _demos(workdir):
    if t.steps and t.task.site not in pages:
      pages[t.task.site] = current_html(t.steps[0].obs_text)
  return pages


def phase_actor(workdir: str, t: int) -> str:
  return os.path.join(workdir, "sft") if t == 0 else os.path.join(workdir, f"phase{t}", "actor")


def _previous_failures(workdir: str, t: int) -> list[types.Task]:
  if t == 1:
    return tasks_lib.read_tasks(os.path.join(workdir, "orm", "failed.jsonl"))
  return tasks_lib.read_tasks(os.path.join(workdir, f"phase{t - 1}", "labels", "failed.jsonl"))


def _critic_features(config, workdir: str, prompts: Sequence[str], cache: str) -> np.ndarray:
  """[N, D] the SFT trunk's state at each prompt's last token (each distinct prompt read once), cached in
  `cache` (.npy)."""
  if os.path.exists(cache):
    return np.load(cache)
  distinct = sorted(set(prompts))
  items = [data.sample(str(i), p, "x") for i, p in enumerate(distinct)]
  trunk = load_policy(os.path.join(workdir, "sft"), mesh=inference_mesh(config))
  feats = scoring.score(trunk, items, **_scoring(config))["hidden"]
  row = {p: i for i, p in enumerate(distinct)}
  feats = feats[[row[p] for p in prompts]]
  if distributed.is_main():  # every process computed the same features; one writes them
    np.save(f"{cache}.tmp{os.getpid()}.npy", feats)
    os.replace(f"{cache}.tmp{os.getpid()}.npy", cache)
  return feats


def _previous_critic(config, workdir: str, t: int, dim: int):
  if t == 1:
    return None
  return critic_lib.restore(stage_config(config, config.critic, seed_offset=20 + t - 1),
                            os.path.join(workdir, f"phase{t - 1}", "critic"), dim)


def phase_stages(config, workdir: str, t: int) -> Stages:
  return Stages(os.path.join(workdir, f"phase{t}"), f"webrl/phase{t}", config)


def collect_phase(config, workdir: str, t: int, behaviour: str) -> dict:
  """Phase t's curriculum and `behaviour`'s rollouts on it: π_{t−1}, or with `rollout.max_lag` L > 0 the actor L
  phases older, collecting while π_{t−1} trains (`pipeline.async_collect`)."""
  phase = phase_stages(config, workdir, t)

  def stage_curriculum(out):
    want = int(config.curriculum.tasks)
    n = 2 * want if config.curriculum.critic_filter else want
    candidates, info = curriculum_candidates(config, workdir, t, n, out)
    kept = candidates[:want]
    if config.curriculum.critic_filter and t > 1:  # phase 1 has no trained critic to filter with
      pages = start_pages(workdir)
      prompts = [curriculum.round0_prompt(c.intent, pages.get(c.site, "")) for c in candidates]
      feats = _critic_features(config, workdir, prompts, os.path.join(out, "round0_feats.npy"))
      band = critic_lib.in_band(*critic_lib.head_probs(_previous_critic(config, workdir, t, feats.shape[-1]), feats),
                                (float(config.curriculum.low), float(config.curriculum.high)))
      passed = [c for c, ok in zip(candidates, band) if ok]
      info["passed_filter"] = len(passed)
      kept = passed[:want] if passed else kept  # none passing: the unfiltered draw, said in the summary
      info["filter_applied"] = bool(passed)
    tasks_lib.write_tasks(os.path.join(out, "tasks.jsonl"), kept)
    return {**info, "tasks": len(kept), "templates": sorted({c.template for c in kept})}

  phase.run("curriculum", stage_curriculum)
  lag = t - 1 - _actor_phase(workdir, behaviour)

  def stage_rollouts(out):
    tasks = tasks_lib.read_tasks(os.path.join(phase.workdir, "curriculum", "tasks.jsonl"))
    trajs = _rollout(config, behaviour, float(config.rollout.temperature), tasks, os.path.join(out, "store"),
                     f"actor{t - 1 - lag}@phase{t}", int(config.seed) + 10 * t,
                     meta={"behaviour_actor": behaviour, "policy_lag": lag})
    return {"episodes": len(trajs), "judged": len(_judged(trajs)), "judge_success": success_rate(_judged(trajs)),
            "early_stops": sum("early_stop" in x.meta for x in trajs), "behaviour": behaviour, "lag": lag}

  return phase.run("rollouts", stage_rollouts)


def curriculum_candidates(config, workdir: str, t: int, n: int, out: str) -> tuple[list[types.Task], dict]:
  """Phase t's candidate tasks from phase t−1's failures, and their summary: `n` variations of the failed tasks'
  templates, or (`curriculum.generator=openai`) what the LLM writes from them (from the train pool when nothing
  failed), less those whose intent is a test intent, shuffled. Process 0 asks the LLM once; its tasks are kept
  in `out/generated.jsonl` (a resumed stage asks no more; none kept: a rerun asks again) and read by every
  process."""
  pool = device.suite(workdir, "train")
  failed = _previous_failures(workdir, t)
  info = {"failed_seeds": len(failed)}
  if config.curriculum.generator != "openai":
    candidates = curriculum.variations(failed, pool, n, int(config.seed) + 100 + t, f"p{t}.")
    return candidates, {**info, "candidates": len(candidates)}
  path, stats_path = os.path.join(out, "generated.jsonl"), os.path.join(out, "generated.json")
  if distributed.is_main() and not os.path.exists(path):
    generator = curriculum.OpenAIGenerator(config.curriculum.openai)
    written, lost = generator.generate(failed or pool, int(config.seed) + 100 + t, f"p{t}.")
    kept, dropped = curriculum.drop_intents(written, [x.intent for x in device.suite(workdir, "test")])
    random.Random(int(config.seed) + 200 + t).shuffle(kept)  # `n` and the filter cut sites evenly
    stats = generator.stats
    write_json(stats_path, {"generated": len(written), "test_intent_drops": dropped, "turns_without_reply": lost,
                            "requests": stats.requests, "prompt_tokens": stats.prompt_tokens,
                            "completion_tokens": stats.completion_tokens})
    if kept:
      tasks_lib.write_tasks(path, kept)
  distributed.barrier(f"webrl/phase{t}: generated tasks")
  candidates = tasks_lib.read_tasks(path) if os.path.exists(path) else []
  if not candidates:
    raise RuntimeError(f"curriculum.generator=openai wrote no usable task ({read_json(stats_path)}); check "
                       f"{config.curriculum.openai.base_url} and ${config.curriculum.openai.api_key_env}")
  return candidates, {**info, **read_json(stats_path), "candidates": len(candidates)}


def _actor_phase(workdir: str, actor: str) -> int:
  """t of `phase_actor(workdir, t) == actor`."""
  t = 0
  while phase_actor(workdir, t) != actor:
    t += 1
  return t


def learn_phase(config, workdir: str, t: int, collector: async_collect.AsyncCollector) -> None:
  """Phase t once its rollouts are in: ORM labels → critic → (phase t+1 may now collect) → actor π_t."""
  if not phase_stages(config, workdir, t).is_done("rollouts"):
    collector.result(t - 1)
  phase = phase_stages(config, workdir, t)  # after the collector's stages, so their timings are kept
  base = phase.workdir
  trajs = [x for x in rollout.episodes(TrajectoryStore(os.path.join(base, "rollouts", "store"))) if data.usable(x)]

  def stage_labels(out):
    loaded = load_policy(os.path.join(workdir, "orm", "model"), mesh=inference_mesh(config))
    probs = orm.probabilities(loaded, trajs, **_scoring(config))
    labels = {x.task.id: float(p) for x, p in zip(trajs, probs)}
    if distributed.is_main():
      write_json(os.path.join(out, "orm.json"), labels)
    rewards = _rewards(config, trajs, labels)
    tasks_lib.write_tasks(os.path.join(out, "failed.jsonl"), [x.task for x, r in zip(trajs, rewards) if r < 1.0])
    return {"episodes": len(trajs), "orm_success": float(np.mean(probs >= 0.5)) if len(trajs) else 0.0,
            "judge_success": success_rate(_judged(trajs)),
            "orm_vs_judge": orm.agreement(probs, [x.success for x in trajs])}  # judged episodes only

  phase.run("labels", stage_labels)
  rewards = _rewards(config, trajs, read_json(os.path.join(base, "labels", "orm.json")))
  rows = data.step_rows(trajs, rewards)
  history = _history(config, workdir, t)

  def stage_critic(out):
    states = rows["state"] + history["state"]
    both = _critic_features(config, workdir, states + rows["next_state"] + history["next_state"],
                            os.path.join(out, "state_feats.npy"))
    feats, nfeats = both[:len(states)], both[len(states):]
    label = np.concatenate([rows["mc_return"], history["mc_return"]]) > 0
    cfg = stage_config(config, config.critic, seed_offset=20 + t)
    model = critic_lib.train(cfg, out, feats, nfeats, label, _previous_critic(config, workdir, t, feats.shape[-1]))
    v = critic_lib.values(model, feats)
    return {"rows": int(len(label)), "positive": float(label.mean()) if len(label) else 0.0,
            "v_success": float(v[label].mean()) if label.any() else None,
            "v_failure": float(v[~label].mean()) if (~label).any() else None}

  phase.run("critic", stage_critic)
  collector.allow(t)  # phase t+1's curriculum reads this phase's failures and critic
  phase.run("actor", lambda out: train_actor(config, workdir, t, rows, history, out))
  collector.publish(t, phase_actor(workdir, t))


def _rewards(config, trajs, labels: dict) -> list[float]:
  """Each episode's reward: the ORM's label 1[p ≥ 0.5] (WebRL), or the judge's verdict (`reward=judge`)."""
  if config.reward == "judge":
    return [float(x.success == 1.0) for x in trajs]
  return [float(labels[x.task.id] >= 0.5) for x in trajs]


def _history(config, workdir: str, t: int) -> dict:
  """The replay candidates: every earlier phase's (and the demonstrations') steps of successful episodes, the
  first successful episode of each task only (`replay_data`), as step rows."""
  trajs = [x for x in _demos(workdir) if data.usable(x)]
  rewards = [float(x.success == 1.0) for x in trajs]
  for k in range(1, t):
    d = os.path.join(workdir, f"phase{k}")
    past = [x for x in rollout.episodes(TrajectoryStore(os.path.join(d, "rollouts", "store"))) if data.usable(x)]
    trajs += past
    rewards += _rewards(config, past, read_json(os.path.join(d, "labels", "orm.json")))
  keep = replay.first_per_task([x.task.intent for x in trajs], [r >= 0.5 for r in rewards])
  return data.step_rows([trajs[i] for i in keep], [rewards[i] for i in keep])


def actor_steps(config, samples: int) -> int:
  """`actor.train.steps`, capped at `actor.epochs` passes over the phase's `samples` (the original trains one
  epoch): a phase whose critic filter left a few tasks does not fit their steps dozens of times over."""
  per_epoch = samples / int(config.actor.train.batch_size)
  return max(1, min(int(config.actor.train.steps), math.ceil(float(config.actor.epochs) * per_epoch)))


def train_actor(config, workdir: str, t: int, rows: dict, history: dict, out: str) -> dict:
  """π_t from π_{t−1} on this phase's steps (advantages from the critic) and the replayed successes."""
  prev = phase_actor(workdir, t - 1)
  phase_dir = os.path.dirname(out)
  both = np.load(os.path.join(phase_dir, "critic", "state_feats.npy"))
  feats, nfeats = np.split(both, 2)
  model = critic_lib.restore(stage_config(config, config.critic, seed_offset=20 + t), os.path.join(phase_dir, "critic"),
                             feats.shape[-1])
  v, v_next = critic_lib.values(model, feats), critic_lib.values(model, nfeats)
  reward = np.concatenate([rows["reward"], history["reward"]])
  mc = np.concatenate([rows["mc_return"], history["mc_return"]])
  adv = np.clip(v_next - v - 0.05 + reward + mc, -1.0, 1.0)  # rl.losses.webrl_advantage_code
  states, actions = rows["state"] + history["state"], rows["action"] + history["action"]
  items = [data.sample(f"s{i}", s, a) for i, (s, a) in enumerate(zip(states, actions))]
  ref = scoring.score(load_policy(prev, mesh=inference_mesh(config)), items, **_scoring(config))
  n_now = len(rows["state"])
  ranks = replay.rank_scores(ref["logp"][n_now:], ref["tokens"][n_now:])
  replayed = replay.select(ranks, n_now, int(config.seed) + 30 + t, (float(config.replay.low),
                                                                     float(config.replay.high)), int(config.replay.cap))
  chosen = list(range(n_now)) + [n_now + int(i) for i in replayed]
  train = [dict(items[i], advantage=float(adv[i]), ref_logp=float(ref["logp"][i])) for i in chosen]
  if config.actor.loss == "sft":
    train = [dict(items[i]) for i in chosen if adv[i] >= 0]
    loss = weighted_token_nll
  elif config.actor.loss == "paper":
    loss = webrl_actor_loss_paper(float(config.actor.beta))
  else:
    loss = webrl_actor_loss(bool(config.actor.add_sft_loss))
  actor_config = stage_config(config, config.actor, seed_offset=40 + t, steps=actor_steps(config, len(train)))
  finetune(actor_config, out, train, init_from=prev, loss=loss)
  return {"phase_steps": n_now, "replay_candidates": len(history["state"]), "replayed": int(len(replayed)),
          "trained_on": len(train), "steps": int(actor_config.train.steps),
          "positive_advantage": float(np.mean(adv[chosen] >= 0)) if chosen else 0.0,
          "mean_ref_prob": float(np.mean(np.exp(ref["logp"] / np.maximum(ref["tokens"], 1)))) if items else None}


def policies(config, workdir: str) -> dict[str, str]:
  """The evaluated actors, by name → model directory: π_0 (`sft`) and each phase's."""
  out = {"sft": phase_actor(workdir, 0)}
  for t in range(1, int(config.phases) + 1):
    out[f"phase{t}"] = phase_actor(workdir, t)
  return out


def test_episodes(config, workdir: str) -> list[types.Task]:
  return draw_episodes(device.suite(workdir, "test"), int(config.eval.episodes), int(config.eval.seed), "eval")


def stage_eval(config, workdir, out):
  results, writer = {}, MetricWriter(out)
  temperature = float(config.eval.temperature)
  tasks = test_episodes(config, workdir)
  for name, model_dir in policies(config, workdir).items():
    trajs = _rollout(config, model_dir, temperature, tasks, os.path.join(out, name), name, int(config.eval.seed))
    results[name] = device.eval_summary(trajs, temperature)
    writer.write_scalars(0, {f"eval/{name}_success_rate": results[name]["success_rate"]})
  writer.close()
  orm_summary = read_json(os.path.join(workdir, "orm", "DONE"))
  phases = [read_json(os.path.join(workdir, f"phase{t}", "labels", "DONE")) for t in range(1, int(config.phases) + 1)]
  held = {"orm_held_out": orm_summary["held_out"], "orm_by_phase": [p["orm_vs_judge"] for p in phases]}
  if distributed.is_main():
    write_json(os.path.join(workdir, "results.json"), results)
    write_json(os.path.join(workdir, "orm_agreement.json"), held)
  return results


def results_table(results: dict) -> str:
  return report.policy_table(results)
