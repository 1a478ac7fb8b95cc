"""The common interface of every agent format: prompt builder, action parser, action renderer.

An agent format is the contract between a model and the environments: how an observation and the
episode so far become model input (`build_prompt`), how the model's text becomes a typed `Action`
(`parse`, which never raises), and the canonical text the original model would emit for an action
(`render`, used by scripted experts and to re-serialise histories).

Prompts come in two shapes:
  * completion formats (WebRL, AutoUI) return one `str`;
  * chat formats (WebVoyager, OpenWebVoyager) return a list of messages in the Hugging Face
    multimodal chat convention: `{"role": "system"|"user"|"assistant", "content": str | [part, ...]}`
    with parts `{"type": "text", "text": str}` and `{"type": "image", "image": ndarray | path}`.
    Chat templates (tokeniser side) render these directly; `to_openai_messages` turns them into the
    OpenAI wire format (`image_url` parts with base64 PNG data URLs) for API models.

`Step.obs_text` holds what `observation_text` returned when that step was recorded (the current user
turn for chat formats, the whole prompt for completion formats); chat formats rebuild the
conversation from it, so recorders must store it.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import inspect
import io
import os
from typing import Any, Callable, ClassVar, Sequence, Union

import numpy as np

from jaxagent.types import Action, ActionKind, Observation, Step, Task

Message = dict[str, Any]
Prompt = Union[str, list[Message]]


def task_intent(task: Task | str) -> str:
  return task.intent if isinstance(task, Task) else str(task)


def human_turn(text: str) -> dict[str, str]:
  """One user turn as training samples hold it (`{"from": "human", "value": ...}`)."""
  return {"from": "human", "value": text}


def history_with_images(history: Sequence[Step]) -> list[Step]:
  """`history` where a step without `image_path` carries its in-memory screenshot in that field instead (formats
  accept an array or a path as an image): during a rollout the screenshots are on `Step.observation`, not on disk."""
  out = []
  for step in history:
    shot = step.observation.screenshot if step.observation is not None else None
    if not step.image_path and shot is not None:
      step = dataclasses.replace(step, image_path=shot)
    out.append(step)
  return out


class AgentFormat(abc.ABC):
  """One system's prompt and action grammar. Subclasses implement `_parse`; `parse` never raises."""

  name: ClassVar[str]
  # Kinds `render` can express and `parse` gives back unchanged (the round-trip set).
  supported_kinds: ClassVar[frozenset[ActionKind]]

  @abc.abstractmethod
  def build_prompt(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> Prompt:
    """The full model input for this step."""

  @abc.abstractmethod
  def observation_text(self, task: Task | str, observation: Observation, history: Sequence[Step]) -> str:
    """What to store in this step's `Step.obs_text` (see the module docstring)."""

  @abc.abstractmethod
  def render(self, action: Action, thought: str = "") -> str:
    """The model output that `parse` maps back to `action` (raises ValueError for unsupported kinds)."""

  @abc.abstractmethod
  def _parse(self, text: str) -> Action:
    """Parse model text; may raise on a bug, never on malformed input (return `Action.invalid`)."""

  def parse(self, text: str) -> Action:
    """Model text -> `Action`. Never raises: malformed text is `invalid` with the original's error text."""
    if not isinstance(text, str):
      return Action.invalid(f"{self.name}: model output must be a str, got {type(text).__name__}")
    try:
      return self._parse(text)
    except Exception as e:  # pylint: disable=broad-except  # a parser bug must not end an episode
      return Action.invalid(f"{self.name}: parser error {type(e).__name__}: {e}")

  def early_stop(self, steps: Sequence[Step]) -> str:
    """The format's own rule to end an episode before `max_steps` (e.g. VAB's for WebRL): a reason, or "" to go
    on. None by default."""
    del steps
    return ""

  # ---- acting with a trained model

  # How malformed output may be read: the first is the default; "faithful" is the original's rule.
  parse_rules: ClassVar[tuple[str, ...]] = ("faithful",)

  def turns(self, observation: Observation, history: Sequence[Step]) -> tuple[list[dict[str, str]] | None, list]:
    """The conversation a model trained on this format reads at this step, as its training samples hold it
    (`{"from": "human"|"gpt", "value"}` turns, `<image>` markers), and the images the markers name, in order.

    A completion format's prompt is one human turn. None for a chat format whose prompt has roles training
    never renders (a system prompt): its `build_prompt` messages go to the checkpoint's chat template as they are.
    """
    prompt = self.build_prompt(observation.intent, observation, history_with_images(history))
    return ([human_turn(prompt)], []) if isinstance(prompt, str) else (None, [])

  def options(self) -> dict[str, Any]:
    """The constructor arguments that rebuild this format (`get_format(name, **options)`), read from the
    attributes of the same names; the parse rule is apart (`parse_rule`)."""
    out = {}
    for name in inspect.signature(type(self).__init__).parameters:
      if name in ("self", "args", "kwargs") or name in self._parse_options:
        continue
      if not hasattr(self, name):
        raise TypeError(f"{type(self).__name__}.options: the constructor argument {name!r} is not kept as an "
                        "attribute of that name; override options()")
      out[name] = getattr(self, name)
    return out

  _parse_options: ClassVar[tuple[str, ...]] = ()  # constructor arguments that `parse_rule` stands for

  @property
  def parse_rule(self) -> str:
    return self.parse_rules[0]

  def set_parse_rule(self, rule: str) -> None:
    if rule not in self.parse_rules:
      raise ValueError(f"agent format {self.name!r} parses by {list(self.parse_rules)}; got parse rule {rule!r}")

  def _unsupported(self, action: Action) -> ValueError:
    kinds = sorted(k.value for k in self.supported_kinds)
    return ValueError(f"{self.name} cannot render action kind {action.kind.value!r}; it renders {kinds}")


# ------------------------------------------------------------------------------------------ registry

_REGISTRY: dict[str, Callable[..., AgentFormat]] = {}


def register(name: str) -> Callable[[Callable[..., AgentFormat]], Callable[..., AgentFormat]]:
  def wrap(factory):
    if name in _REGISTRY:
      raise ValueError(f"agent format {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory
  return wrap


def get_format(name: str, **kwargs: Any) -> AgentFormat:
  """The agent format registered as `name`, built with `kwargs` (its flags)."""
  if name not in _REGISTRY:
    raise KeyError(f"unknown agent format {name!r}; known formats are {sorted(_REGISTRY)}")
  return _REGISTRY[name](**kwargs)


def format_names() -> list[str]:
  return sorted(_REGISTRY)


# ---------------------------------------------------------------------------------- message helpers


def text_part(text: str) -> dict[str, Any]:
  return {"type": "text", "text": text}


def image_part(image: np.ndarray | str) -> dict[str, Any]:
  return {"type": "image", "image": image}


def png_bytes(image: np.ndarray) -> bytes:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  arr = np.asarray(image)
  if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] not in (3, 4):
    raise ValueError(f"screenshot must be uint8 [H, W, 3|4], got {arr.dtype} {arr.shape}")
  buf = io.BytesIO()
  Image.fromarray(arr).save(buf, format="PNG")
  return buf.getvalue()


def image_data_url(image: np.ndarray | str | bytes, image_root: str | None = None) -> str:
  """A `data:image/png;base64,...` URL for an array, PNG bytes, or a path (relative to `image_root`)."""
  if isinstance(image, str):
    if image.startswith("data:"):
      return image
    path = image if image_root is None or os.path.isabs(image) else os.path.join(image_root, image)
    with open(path, "rb") as f:
      data = f.read()
  elif isinstance(image, bytes):
    data = image
  else:
    data = png_bytes(image)
  return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def to_openai_messages(messages: Sequence[Message], image_root: str | None = None) -> list[dict[str, Any]]:
  """HF-style messages -> OpenAI chat messages (images as base64 PNG `image_url` parts)."""
  out = []
  for m in messages:
    content = m["content"]
    if isinstance(content, str):
      out.append({"role": m["role"], "content": content})
      continue
    parts = []
    for p in content:
      if p["type"] == "image":
        parts.append({"type": "image_url", "image_url": {"url": image_data_url(p["image"], image_root)}})
      else:
        parts.append(dict(p))
    out.append({"role": m["role"], "content": parts})
  return out


def count_images(messages: Sequence[Message]) -> int:
  return sum(1 for m in messages if not isinstance(m["content"], str) for p in m["content"] if p["type"] == "image")
