"""The AutoUI phone agent the device recipes share (Digi-Q `reference/algorithms.md` §5, DigiRL §4).

  env          the bundled sites' phone profile: the actor sees the raw screen and taps at points, as AitW's
               agents do; the scripted expert also gets set-of-marks elements (not drawn) and the oracle's targets.
               `config.env.observation=html` (DigiRL): the actor reads the screen as WebRL's compact simplified HTML
               instead (`agents.autoui_text`: AutoUI's prompt and actions, a tap naming the page's element), a text
               decoder's input, served without a browser when `config.env.browser=text`; samples are then text alone
  the prompt   the AutoUI prompt (`Previous Actions: … Goal: …</s>`) over the 1/4-resolution screenshot (the seeds'
               `smaller_images/`), one human turn `<image>\n<prompt>`: what the VLM is trained on (`sample`) and
               prompted with when acting (`agents.autoui.AutoUI.turns`, through `pipeline.policy.ModelPolicy`)
  formats      `FORMAT` parses leniently (a malformed decision is an invalid no-op); `FAITHFUL` as the originals
               run it: a decision the original's split cannot unpack is TaskImpossible and ends the episode (§4.3);
               `config.parse` picks the one an actor's `agent.json` records
  il           the scripted expert's demonstrations on the train tasks → the VLM fine-tuned on their successful
               steps (both recipes start from this actor, as the seeds start from AutoUI's SFT checkpoint)
  autoui       `config.model.kind=autoui`: the actor is the original's encoder-decoder instead, trained on the same
               samples (`data.seq2seq`) and acting through `serving.seq2seq_engine`
"""

from __future__ import annotations

import os
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import types
from jaxagent.agents import autoui, autoui_text
from jaxagent.agents.base import human_turn
from jaxagent.agents.images import SCREEN_SCALE as DOWNSCALE, ImageLike, downscale, to_pil  # noqa: F401  # re-exported
from jaxagent.data.store import TrajectoryStore
from jaxagent.envs.sites.expert import ScriptedExpert
from jaxagent.judges.evaluators import ProgrammaticJudge
from jaxagent.pipeline import rollout as rollout_lib
from jaxagent.pipeline.config import ConfigError, stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.stages import save_png
from jaxagent.pipeline import tasks as tasks_lib
from jaxagent.pipeline.tasks import draw_episodes, read_tasks, success_rate

FORMAT = autoui.AutoUI()
FAITHFUL = autoui.AutoUI(faithful_task_impossible=True)
PARSERS = {"lenient": FORMAT, "faithful": FAITHFUL}
# config.env.observation: what the actor reads of the phone, the screen's pixels (the faithful default) or its
# simplified HTML (agents/autoui_text.py says why)
OBSERVATIONS = ("screenshot", "html")


def reads_text(config) -> bool:
  """Whether the actor reads the screen as text (`config.env.observation=html`; a config without the key: no)."""
  env = config.get("env")
  return env is not None and env.get("observation", "screenshot") == "html"


def actor_format(config) -> autoui.AutoUI:
  """The AutoUI format the recipe's actors act in: parsing by `config.parse`, over the screenshot or (`reads_text`)
  the page cut at `config.data.page_chars`."""
  if reads_text(config):
    return autoui_text.AutoUIText(faithful_task_impossible=config.parse == "faithful",
                                  max_page_chars=int(config.data.page_chars))
  return PARSERS[config.parse]


# ------------------------------------------------------------------------------------------- the env


def check_observation(config, text: bool) -> None:
  """`config.env.observation` and the keys it binds, before any work; `text`: whether the recipe takes the text
  observation (DigiRL does; Digi-Q's representation and its labels are the screen's pixels)."""
  seen = config.env.get("observation", "screenshot")
  if seen != "screenshot" and not text:
    raise ConfigError(f"config.env.observation={seen!r}: this recipe reads the phone's screenshot only (Digi-Q's "
                      "representation model answers whether an action changes the screen's pixels, and its labels "
                      "are their difference); set --config.env.observation=screenshot")
  if seen not in OBSERVATIONS:
    raise ConfigError(f"config.env.observation={seen!r} is not one of {OBSERVATIONS}; set "
                      "--config.env.observation=screenshot (the faithful default) or html (the screen as text)")
  kind, browser = config.model.kind, config.env.get("browser", "chromium")
  if seen == "html":
    if kind != "decoder":
      raise ConfigError(f"config.model.kind={kind!r} with config.env.observation='html': the screen as text is read "
                        "by a text decoder; set --config.model.kind=decoder (configs/digirl.py:text=1 sets it all)")
    if config.judge.kind != "programmatic":
      raise ConfigError(f"config.judge.kind={config.judge.kind!r} with config.env.observation='html': the LLM "
                        "evaluator reads screenshots, which a text observation does not keep; set "
                        "--config.judge.kind=programmatic")
  elif kind == "decoder":
    raise ConfigError("config.model.kind='decoder' with config.env.observation='screenshot': a text decoder cannot "
                      "see the screen; set --config.env.observation=html (or --config.model.kind=vlm)")
  elif browser == "text":
    raise ConfigError("config.env.browser='text' with config.env.observation='screenshot': the text backend draws no "
                      "screen; set --config.env.browser=chromium (or --config.env.observation=html)")


def env_spec(config, expert: bool = False) -> dict:
  """The phone on the bundled sites for `config.tasks.seed` (see the module doc)."""
  if reads_text(config):  # the expert names the same page's elements the actor reads
    return rollout_lib.site_env("device", "html", config.tasks.seed, config.env, oracle_targets=expert)
  if expert:
    return rollout_lib.site_env("device", "som", config.tasks.seed, config.env, som_draw=False,
                                oracle_targets=True)
  return rollout_lib.site_env("device", "screenshot", config.tasks.seed, config.env)


def stage_tasks(config, out: str) -> dict:
  """The phone-profile (AitW action space) suites (`pipeline.tasks.stage_tasks`)."""
  return tasks_lib.stage_tasks(config, out, "device")


def suite(workdir: str, split: str) -> list[types.Task]:
  """The `tasks` stage's `split` suite."""
  return read_tasks(os.path.join(workdir, "tasks", f"{split}.jsonl"))


def read_store(*parts: str) -> tuple[TrajectoryStore, list[types.Trajectory]]:
  """The store and its episodes (`rollout.episodes`: the last record of each id, errored ones left out)."""
  store = TrajectoryStore(os.path.join(*parts))
  return store, rollout_lib.episodes(store)


# -------------------------------------------------------------------------------------- the prompt


turn = autoui.prompt_turns  # a training sample's human turn, as the format builds it when acting


def sample(sample_id: str, image_path: str | None, prompt: str, answer: str, weight: float = 1.0) -> dict:
  """A training sample: `turn(prompt)` → the action string, weighted; `image_path` None: a text observation's
  sample, whose prompt (`Step.obs_text`) holds the page."""
  human = turn(prompt) if image_path is not None else [human_turn(prompt)]
  return {"id": sample_id, "images": [image_path] if image_path is not None else [], "weight": float(weight),
          "conversations": human + [{"from": "gpt", "value": answer}]}


def has_state(step: types.Step, text: bool = False) -> bool:
  """Whether a stored step can be a sample: its action and its state (the screenshot, or with `text` the prompt)."""
  return bool(step.action_text) and bool(step.obs_text if text else step.image_path)


def _state_image(store: TrajectoryStore, step: types.Step, path: str, text: bool) -> str | None:
  """The step's 1/4 screenshot written to `path` (None for a text observation's sample)."""
  return None if text else save_png(path, downscale(store.load_image(step.image_path)))


def step_samples(trajs: Sequence[types.Trajectory], store: TrajectoryStore, image_dir: str,
                 only_success: bool = True, text: bool = False) -> list[dict]:
  """A sample of every step of (the successful) `trajs`, its 1/4 screenshot written under `image_dir` (`text`:
  the prompt alone)."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for traj in trajs:
    if only_success and traj.success != 1.0:
      continue
    for s in traj.steps:
      if not has_state(s, text):
        continue
      name = f"{traj.meta.get('episode_id', traj.task.id)}-{s.step}.png".replace("/", "_")
      path = _state_image(store, s, os.path.join(image_dir, name), text)
      items.append(sample(f"{traj.task.id}-{s.step}", path, s.obs_text, s.action_text))
  return items


def state_samples(store: TrajectoryStore | Sequence[TrajectoryStore], trajs: Sequence[types.Trajectory], picks,
                  image_dir: str, text: bool = False) -> list[dict]:
  """Samples of dataset states: for each pick (trajectory i, step k, action string, weight) the state's
  1/4 screenshot (written under `image_dir`; none with `text`), its AutoUI prompt and that action. `store`: the
  trajectories' store, or one per trajectory."""
  os.makedirs(image_dir, exist_ok=True)
  items = []
  for i, k, action, weight in picks:
    step = trajs[i].steps[k]
    src = store[i] if isinstance(store, (list, tuple)) else store
    path = _state_image(src, step, os.path.join(image_dir, f"{i}-{k}.png"), text)
    items.append(sample(f"{i}-{k}", path, step.obs_text, action, weight))
  return items


@nnx.jit
def _pooled_image_features(model, images):
  return jnp.mean(model.image_features(images), axis=1).astype(jnp.float32)


def screen_features(loaded, screens: Sequence[np.ndarray], batch: int = 32) -> np.ndarray:
  """[len(screens), D] the VLM's projected vision features of each 1/4 screenshot (an AutoUI actor's: its frozen
  encoder's, as the originals' critics and actor share BLIP-2), mean-pooled: the frozen image features the seeds'
  critics read (BLIP-2's pooled ViT-g of the screen, §4.2, §5.3). Fixed-size batches (one compilation); `loaded`:
  a `serving.checkpoint.LoadedModel`."""
  out = []
  for start in range(0, len(screens), batch):
    chunk = [downscale(s) for s in screens[start:start + batch]]
    pix = np.asarray(loaded.preprocess(chunk), np.float32)
    full = np.zeros((batch,) + pix.shape[1:], np.float32)
    full[:len(chunk)] = pix
    out.append(np.asarray(_pooled_image_features(loaded.model, full))[:len(chunk)])
  if out:
    return np.concatenate(out)
  cfg = loaded.model.config
  return np.zeros((0, int(cfg.img_dim if loaded.kind == "autoui" else cfg.text.hidden_size)), np.float32)


# ---------------------------------------------------------------------------------------- IL stage


def rollout(config, spec, policy, tasks, store_dir, name, *, gamma: float, judge=None,
            meta: dict | None = None, early_stop=None) -> list[types.Trajectory]:
  """`pipeline.rollout.rollout` with the recipe's env block, judge (programmatic unless given) and progress bar;
  `meta` goes into every new trajectory's meta; `early_stop` as in `rl.collector.collect`."""
  return rollout_lib.rollout(spec, config.env, policy, tasks, store_dir, judge=judge or ProgrammaticJudge(),
                             name=name, gamma=gamma, progress=bool(config.train.progress_bar), meta=meta,
                             early_stop=early_stop)


def demo_samples(workdir: str, text: bool = False) -> list[dict]:
  """The IL stage's samples: the expert's successful demonstration steps (images under `il/images`; `text`: the
  prompts alone)."""
  store, trajs = read_store(workdir, "il", "demos")
  return step_samples(trajs, store, os.path.join(workdir, "il", "images"), text=text)


def finetune_with_demos(stage_cfg, workdir: str, out: str, items: list[dict], il_weight: float, init_from: str,
                        loss) -> int:
  """An actor trained from `init_from` on `items` plus the demonstrations at weight `il_weight` (none at 0), as
  both device recipes keep the demonstrations in their actors' mix; returns how many demonstration samples
  joined."""
  demos = [dict(it, weight=float(il_weight)) for it in demo_samples(workdir, reads_text(stage_cfg))
           ] if il_weight > 0 else []
  finetune(stage_cfg, out, items + demos, agent=actor_format(stage_cfg), init_from=init_from, loss=loss)
  return len(demos)


def demo_tasks(config, workdir: str) -> list[types.Task]:
  """The demonstration episodes: `config.demos.episodes` drawn from the `config.demos.split` suite with the
  run's seed."""
  return draw_episodes(suite(workdir, config.demos.split), int(config.demos.episodes), int(config.seed), "demo")


def stage_il(config, workdir: str, out: str, gamma: float) -> dict:
  """The scripted expert's `demo_tasks`, then the VLM trained on their successful steps with the `config.il`
  stage block."""
  fmt = actor_format(config)
  expert = ScriptedExpert(fmt.name, **fmt.options())  # its demonstrations' prompts are the actor's
  trajs = rollout(config, env_spec(config, expert=True), expert, demo_tasks(config, workdir),
                  os.path.join(out, "demos"), f"scripted_expert:{fmt.name}", gamma=gamma)
  items = demo_samples(workdir, reads_text(config))
  if not items:
    raise RuntimeError("the scripted expert solved no demonstration task; check the sites and the browser")
  finetune(stage_config(config, config.il), out, items, agent=fmt)
  return {"demos": len(trajs), "expert_success": success_rate(trajs), "samples": len(items)}
