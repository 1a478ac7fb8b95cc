"""What every Digi-Q stage shares: resumable stage directories, per-stage sub-configs, the VLM actor as a
`Policy`, VLM training from a checkpoint, and resumable rollouts through the pool."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from jaxagent import types
from jaxagent.agents import get_format
from jaxagent.data import digiq as digiq_data
from jaxagent.data import pipeline
from jaxagent.data.store import TrajectoryStore
from jaxagent.data.tokenizer import END_OF_UTTERANCE, IMAGE_TOKEN, load_tokenizer
from jaxagent.train import loop

DONE = "DONE"


# ------------------------------------------------------------------------------------------- stages


def stage_dir(workdir: str, name: str) -> str:
  path = os.path.join(workdir, name)
  os.makedirs(path, exist_ok=True)
  return path


def is_done(workdir: str, name: str) -> bool:
  return os.path.exists(os.path.join(workdir, name, DONE))


def mark_done(workdir: str, name: str, summary: dict[str, Any]) -> None:
  """Writes `<workdir>/<name>/DONE` (the stage's summary as JSON) atomically: present means finished."""
  path = os.path.join(stage_dir(workdir, name), DONE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  os.replace(path + ".tmp", path)


def read_done(workdir: str, name: str) -> dict[str, Any]:
  with open(os.path.join(workdir, name, DONE), encoding="utf-8") as f:
    return json.load(f)


def write_json(path: str, obj: Any) -> None:
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1)
  os.replace(path + ".tmp", path)


class Timer:
  """Per-stage wall time, printed as a table at the end (`<workdir>/timings.json` keeps earlier runs' too)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, "timings.json")
    self.times: dict[str, float] = {}
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        self.times = json.load(f)

  def record(self, name: str, seconds: float) -> None:
    self.times[name] = self.times.get(name, 0.0) + seconds
    write_json(self.path, self.times)

  def table(self) -> str:
    rows = [f"  {k:<16} {v:8.1f} s" for k, v in self.times.items()]
    return "\n".join(["stage times (this workdir, all runs):"] + rows +
                     [f"  {'total':<16} {sum(self.times.values()):8.1f} s"])


def run_stage(workdir: str, name: str, fn: Callable[[str], dict[str, Any]], timer: Timer) -> dict[str, Any]:
  """Runs `fn(stage_dir)` unless the stage is DONE; returns its summary."""
  if is_done(workdir, name):
    print(f"[digiq] {name}: done already, skipped")
    return read_done(workdir, name)
  print(f"[digiq] {name} ...", flush=True)
  t0 = time.monotonic()
  summary = fn(stage_dir(workdir, name))
  timer.record(name, time.monotonic() - t0)
  mark_done(workdir, name, summary)
  print(f"[digiq] {name}: {json.dumps(summary)}", flush=True)
  return summary


def sub_config(config, *, steps: int, batch_size: int, lr: float, seed_offset: int = 0):
  """The config of one VLM training stage: the shared blocks with this stage's steps, batch and learning rate."""
  c = copy.deepcopy(config)
  c.unlock()
  c.recipe = "digiq"  # `serving.load_policy` rebuilds the model with `recipes.digiq.build_model`
  c.seed = int(config.seed) + seed_offset
  c.train.steps = int(steps)
  c.train.batch_size = int(batch_size)
  c.train.log_every = max(1, min(int(c.train.log_every), int(steps)))
  c.optim.lr = float(lr)
  c.optim.warmup_steps = min(int(c.optim.warmup_steps), max(int(steps) // 10, 1))
  c.checkpoint.every = min(int(c.checkpoint.every), int(steps))
  return c


# ------------------------------------------------------------------------------------ prompts, images


def chat_prompt(tokenizer, human: str) -> str:
  """The training render (`data.conversation.render`) of one human turn, up to the assistant's reply."""
  return f"{tokenizer.bos_token or ''}User: {human}{END_OF_UTTERANCE}\nAssistant:"


def small_screen(image) -> np.ndarray:
  """The 1/4-resolution screenshot the VLM sees (Digi-Q's `smaller_images/`, §5.1 step 2)."""
  return digiq_data.downscale(image)


def sample_item(sample_id: str, image_path: str, prompt: str, answer: str, weight: float = 1.0) -> dict:
  """An OWV conversation sample (`<image>` + the AutoUI prompt → the action string)."""
  return {"id": sample_id, "images": [image_path], "weight": float(weight),
          "conversations": [{"from": "human", "value": f"{IMAGE_TOKEN}\n{prompt}"},
                            {"from": "gpt", "value": answer}]}


def save_png(path: str, image: np.ndarray) -> str:
  if not os.path.exists(path):
    Image.fromarray(np.asarray(image)).save(path + ".tmp.png")
    os.replace(path + ".tmp.png", path)
  return path


# ---------------------------------------------------------------------------------------- the actor


class VLMActor:
  """The VLM as an AutoUI `Policy`: `<image>` (the 1/4 screenshot) + the AutoUI prompt → an action string.

  All rows of an `act` call go to one engine call (the engine batches them into one sampler call).
  """

  def __init__(self, loaded, temperature: float, max_tokens: int, max_batch: int = 32, seed: int = 0):
    from jaxagent.serving.engine import Engine  # pylint: disable=g-import-not-at-top
    self.engine = Engine(loaded, max_batch=max_batch, max_new_tokens=max_tokens, seed=seed)
    self.tokenizer = loaded.tokenizer
    self.temperature, self.max_tokens = float(temperature), int(max_tokens)
    self.fmt = get_format("autoui")

  def generate(self, prompts: Sequence[str], images: Sequence[np.ndarray], temperature: float | None = None
               ) -> list[str]:
    from jaxagent.serving.engine import GenerationRequest  # pylint: disable=g-import-not-at-top
    t = self.temperature if temperature is None else float(temperature)
    reqs = [GenerationRequest(prompt=chat_prompt(self.tokenizer, f"{IMAGE_TOKEN}\n{p}"), images=[img],
                              max_tokens=self.max_tokens, temperature=t) for p, img in zip(prompts, images)]
    return [r.text.strip() for r in self.engine.generate(reqs)] if reqs else []

  def act(self, observations: Sequence[types.Observation], histories: Sequence[list[types.Step]]) -> list[str]:
    prompts = [self.fmt.build_prompt(o.intent, o, h) for o, h in zip(observations, histories)]
    return self.generate(prompts, [small_screen(o.screenshot) for o in observations])


def load_actor(path: str, config, temperature: float, seed: int = 0) -> VLMActor:
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top
  loaded = load_policy(path, config=config)
  return VLMActor(loaded, temperature, config.sampling.max_tokens, config.sampling.max_batch, seed)


# ----------------------------------------------------------------------------------- VLM training


def weighted_il_loss(model, batch: dict, rng: jax.Array):
  """−Σ_i w_i Σ_t log π(a_t | s, a_<t) / Σ_i Σ_t 1 over assistant tokens: `losses.bc_nll`'s weighted NLL
  (Digi-Q's actor loss, §5.5: L = −mean(w · Σ_tokens log π(a* | s))), normalised per token like IL."""
  del rng
  from jaxagent.recipes.il import flat_images  # pylint: disable=g-import-not-at-top
  logits = model(batch["input_ids"], flat_images(batch["images"], batch["image_mask"]),
                 attention_mask=batch["attention_mask"])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  tok = jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  mask = batch["loss_mask"].astype(jnp.float32)
  count = mask.sum()
  w = batch["weight"].astype(jnp.float32)[:, None]
  loss = -jnp.sum(jnp.where(mask > 0, tok * w, 0.0)) / jnp.maximum(count, 1.0)
  hits = (jnp.argmax(logits, -1) == batch["targets"]) * mask
  return loss, {"loss_tokens": count, "token_accuracy": hits.sum() / jnp.maximum(count, 1)}


@dataclasses.dataclass
class _WeightedEncode(pipeline.EncodeSample):
  def __call__(self, item: dict) -> dict:
    out = super().__call__(item)
    out["weight"] = np.float32(item.get("weight", 1.0))
    return out


def build_vlm(config, tokenizer):
  """((model_fn, FLOPs per token, image tokens, preprocessing), pretrained loader or None): `il.build_model`,
  whichever of its two return forms (the bare 4-tuple, or the 4-tuple with a loader) is installed."""
  from jaxagent.recipes import il  # pylint: disable=g-import-not-at-top
  out = il.build_model(config, tokenizer)
  return (out, None) if len(out) == 4 else out


def _on_host(model):
  """The model with host (numpy) parameters: `load_policy` places them on one device, and the training mesh may
  span several, where committed single-device arrays cannot enter its jit."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.device_get(state))


def train_vlm(config, workdir: str, items: list[dict], init_from: str | None = None) -> str:
  """Trains the VLM on weighted conversation samples (`weighted_il_loss`) with the shared loop (Orbax resume);
  a fresh run starts from the policy at `init_from` (a training workdir), else from random init."""
  from jaxagent.serving.checkpoint import load_policy  # pylint: disable=g-import-not-at-top
  os.makedirs(workdir, exist_ok=True)
  tokenizer = load_tokenizer(config.data.tokenizer or None)
  tokenizer.save_pretrained(os.path.join(workdir, "tokenizer"))
  (model_fn, flops, num_image_tokens, preprocess), _ = build_vlm(config, tokenizer)
  from jaxagent.data import conversation  # pylint: disable=g-import-not-at-top
  longest = max(len(conversation.tokenize(it, tokenizer, num_image_tokens)[0]) for it in items)
  if longest > config.data.seq_len + 1:  # a cut action string would teach the actor unparsable outputs
    raise ValueError(f"a training sample has {longest} tokens but config.data.seq_len={config.data.seq_len}; "
                     f"raise --config.data.seq_len to at least {longest}")
  # Batches are padded to the longest sample (rounded up to 32), not to seq_len: the representation task's
  # samples are half as long as the actor's, and no step should pay for attention over padding.
  seq_len = min(int(config.data.seq_len), -(-(longest - 1) // 32) * 32)
  encode = _WeightedEncode(tokenizer, seq_len, num_image_tokens, preprocess,
                           preprocess.crop_size or preprocess.size, config.data.max_images)
  ds = pipeline.il_dataset(items, encode, batch_size=config.train.batch_size, seed=int(config.seed))
  pretrained = (lambda: _on_host(load_policy(init_from, config=config).model)) if init_from else None
  return loop.train(config, workdir, model_fn=model_fn, loss_fn=weighted_il_loss, dataset=ds,
                    flops_per_token=flops, read_options=pipeline.read_options(config.data.num_threads),
                    pretrained=pretrained)


# ---------------------------------------------------------------------------------------- rollouts


def pool_spec(expert: bool = False) -> dict[str, Any]:
  """The phone (device profile) on the bundled sites. The actor sees the raw screen and taps at points, as AitW's
  agents do: no element numbering. The scripted expert also gets set-of-marks elements (not drawn) and the
  oracle's targets, to turn into touch points."""
  from jaxagent.envs.sites import server  # pylint: disable=g-import-not-at-top
  spec = {"kind": "jaxagent.envs.sites.env:SiteEnv", "profile": "device", "observation": "screenshot",
          "base_url": server.ensure_server(0)}
  if expert:
    spec.update(observation="som", som_draw=False, oracle_targets=True)
  return spec


def stored_ids(store: TrajectoryStore) -> set[str]:
  return {store.read_json(i)["task"]["id"] for i in range(len(store))}


def rollout(config, store_dir: str, policy, tasks: Sequence[types.Task], name: str, expert: bool = False
            ) -> list[types.Trajectory]:
  """Every task once through the pool (`pool_spec(expert)`), judged, into the store at `store_dir`;
  episodes already there (a killed run) are kept and not run again. Returns the trajectories in task order."""
  from jaxagent.envs.pool import EnvPool  # pylint: disable=g-import-not-at-top
  from jaxagent.judges import evaluators  # pylint: disable=g-import-not-at-top
  from jaxagent.rl.collector import collect  # pylint: disable=g-import-not-at-top
  store = TrajectoryStore(store_dir)
  todo = [t for t in tasks if t.id not in stored_ids(store)]
  if todo:
    with EnvPool(pool_spec(expert), num_workers=min(int(config.env.workers), len(todo)),
                 step_timeout=config.env.step_timeout, reset_timeout=config.env.reset_timeout) as pool:
      collect(pool, policy, policy.fmt.parse, todo, store=store, judge=evaluators.ProgrammaticJudge(),
              gamma=float(config.critic.gamma), progress=bool(config.train.progress_bar), policy_name=name,
              keep_screenshots=False)
  store.refresh()
  by_id = {}
  for i in range(len(store)):
    traj = store.read(i)
    by_id[traj.task.id] = traj
  return [by_id[t.id] for t in tasks if t.id in by_id]


def success_rate(trajs: Sequence[types.Trajectory]) -> float:
  return float(np.mean([t.success == 1.0 for t in trajs])) if trajs else 0.0
