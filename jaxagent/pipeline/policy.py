"""Acting with a trained model: one policy (`ModelPolicy`) and one loader (`load`).

A trained actor's directory says how it acts (`agents.spec`: its `agent.json`), so every caller (a recipe's
stages, `jaxagent.evaluate`, `jaxagent.serve`) prompts it with the bytes it was trained on: the format builds the
turns training rendered (`AgentFormat.turns`), the engine renders them as training did (`training_prompt`) and
samples all rows of one `act` in one call (`serving.engines.engine_for`: decoder, Qwen2.5-VL or AutoUI).
"""

from __future__ import annotations

import collections
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxagent import sharding, types
from jaxagent.agents import get_format, spec as agent_spec
from jaxagent.agents.base import AgentFormat, history_with_images
from jaxagent.serving.checkpoint import LoadedModel, load_policy, workdir_of
from jaxagent.serving.engine import GenerationRequest, RequestError
from jaxagent.serving.engines import engine_for


class ModelPolicy:
  """`types.Policy` over a loaded model: `fmt` builds each row's prompt and parses the replies.

  A row whose prompt does not fit the model (its context, or AutoUI's 512 encoder tokens) gets the empty reply
  (the format's parse error, as a server's 400 would give the original agent), counted in `stats["too_long"]`.
  """

  def __init__(self, loaded: LoadedModel, fmt: AgentFormat | str, engine=None, *, temperature: float = 1.0,
               max_tokens: int = 256, top_p: float = 1.0, top_k: int = 0, stop: Sequence[str] = (),
               max_batch: int = 32, seed: int = 0, prefix_cache_bytes: int = 0):
    self.loaded = loaded
    self.fmt = fmt if isinstance(fmt, AgentFormat) else get_format(fmt)
    cache = {"prefix_cache_bytes": int(prefix_cache_bytes)} if prefix_cache_bytes else {}
    self.engine = engine or engine_for(loaded, max_batch=max_batch, max_new_tokens=max_tokens, seed=seed, **cache)
    self.sampling = dict(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                         max_tokens=int(max_tokens), stop=tuple(stop))
    self.stats = collections.Counter()

  def prompt(self, observation: types.Observation, history: Sequence[types.Step]) -> tuple[object, list]:
    """(the prompt the engine continues, its images): the training render of the format's turns, or a chat
    format's messages as they are (`AgentFormat.turns` is None)."""
    turns, images = self.fmt.turns(observation, history)
    if turns is None:
      return self.fmt.build_prompt(observation.intent, observation, history_with_images(history)), []
    return self.engine.training_prompt(turns), images

  def generate(self, prompts: Sequence[tuple[object, list]], temperature: float | None = None) -> list[str]:
    """One stripped reply per (prompt, images); "" for a prompt that does not fit. An engine that reports its
    tokens (the decoder's and VLM's) gives `types.Sample`s: the text with the prompt's and the reply's token ids
    and the reply's sampling-time log-probs."""
    sampling = dict(self.sampling, **({} if temperature is None else {"temperature": float(temperature)}))
    prepared, rows = [], []
    for i, (prompt, images) in enumerate(prompts):
      try:
        prepared.append(self.engine.prepare(GenerationRequest(prompt=prompt, images=list(images), **sampling)))
        rows.append(i)
      except RequestError:
        self.stats["too_long"] += 1
    out = [""] * len(prompts)
    for i, result in zip(rows, self.engine.generate(prepared) if prepared else []):
      out[i] = result.text.strip()
      if result.tokens and result.sample_logprobs:
        out[i] = types.Sample(out[i], result.prompt_ids, result.tokens, result.sample_logprobs)
    self.stats["rows"] += len(prompts)
    return out

  def generate_turns(self, turns: Sequence[list[dict]], images: Sequence[list], temperature: float | None = None
                     ) -> list[str]:
    """`generate` on conversation turns as training samples hold them (e.g. a dataset state's prompt)."""
    return self.generate([(self.engine.training_prompt(t), list(im)) for t, im in zip(turns, images)], temperature)

  def set_weights(self, state) -> None:
    """Act with the weights `state` from now on (an `nnx.State` of this model's structure, e.g. a learner's
    `nnx.state(model)`): weights in memory, with no checkpoint round trip and no recompilation (the sampler's
    program is keyed on shapes and the module's structure, which stay). The arrays are copied, so a train step
    that donates its state cannot delete what the policy samples with, and placed as this policy's own are (a
    learner's mesh is not the policy's: host values, as `jax.distributed` learners hand over, are placed too)."""
    nnx.update(self.loaded.model, jax.tree.map(_placed_like, state, nnx.state(self.loaded.model)))

  def act(self, observations: Sequence[types.Observation], histories: Sequence[list[types.Step]]) -> list[str]:
    if len(observations) != len(histories):
      raise ValueError(f"act: {len(observations)} observations but {len(histories)} histories")
    return self.generate([self.prompt(o, h) for o, h in zip(observations, histories)])


def _placed_like(new, old: jax.Array) -> jax.Array:
  """A fresh array of `new`'s value placed as `old` is: its sharding and whether it is committed to it (the
  sampler's compiled program is keyed on both, so a hand-over that kept either would recompile it)."""
  if old.committed:
    return jax.device_put(new, old.sharding, may_alias=False)
  if isinstance(new, jax.Array) and not new.committed and new.sharding == old.sharding:
    return jnp.copy(new)
  return jnp.asarray(np.asarray(new))  # uncommitted, on the default device as `old` is


def agent_format(model_dir: str, fmt: AgentFormat | str | None = None, parse: str | None = None) -> AgentFormat:
  """How the actor in `model_dir` acts: `fmt` when given, else its `agent.json`; `parse` overrides the rule."""
  if fmt is None:
    workdir = workdir_of(model_dir)
    spec = agent_spec.read(workdir)
    if spec is None:
      raise FileNotFoundError(f"{model_dir} has no {agent_spec.AGENT_FILE} (a recipe's training stage writes it "
                              "beside config.json); name the agent format it was trained with (--format NAME)")
    fmt = agent_spec.from_spec(spec, os.path.join(workdir, agent_spec.AGENT_FILE))
  elif isinstance(fmt, str):
    fmt = get_format(fmt)
  if parse:
    fmt.set_parse_rule(parse)
  return fmt


def load(model_dir: str, *, temperature: float, seed: int = 0, mesh=None, max_tokens: int = 128,
         max_batch: int = 32, fmt: AgentFormat | str | None = None, parse: str | None = None,
         prefix_cache_bytes: int = 0) -> ModelPolicy:
  """The actor in `model_dir` (a recipe stage, a training workdir or step, an export, a HF directory) as a
  `ModelPolicy`, acting as its `agent.json` says (or as `fmt`), its parameters on `mesh` (default one device).
  `prefix_cache_bytes`: the engine's prefix cache (`serving.prefix_cache`; decoders only), 0 for none."""
  fmt = agent_format(model_dir, fmt, parse)
  loaded = load_policy(model_dir, mesh=mesh)
  spec = agent_spec.read(workdir_of(model_dir)) or {}
  template = spec.get("chat_template")
  if template and loaded.kind != "autoui" and template != getattr(loaded.tokenizer, "chat_template", None):
    raise ValueError(f"{model_dir}: its tokenizer's chat template differs from the one the actor was trained with "
                     f"({agent_spec.AGENT_FILE}); restore the workdir's tokenizer/")
  return ModelPolicy(loaded, fmt, temperature=temperature, max_tokens=max_tokens, max_batch=max_batch, seed=seed,
                     prefix_cache_bytes=prefix_cache_bytes)


def inference_mesh(config):
  """The mesh of this process's devices the recipe's policies run on (`config.inference_mesh`; one device for a
  config written before the key existed)."""
  return sharding.local_mesh(dict(config.get("inference_mesh", {})))


def load_actor(config, model_dir: str, temperature: float, seed: int) -> ModelPolicy:
  """`load` with a recipe config's mesh and `sampling` token budget and batch."""
  return load(model_dir, temperature=temperature, seed=seed, mesh=inference_mesh(config),
              max_tokens=int(config.sampling.max_tokens), max_batch=int(config.sampling.max_batch))
