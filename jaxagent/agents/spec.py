"""`agent.json`: how a trained actor acts, written beside its `config.json` and `tokenizer/`.

The stage that trains an actor records its agent format, the format's options, its parse rule and the chat
template its samples were rendered with, so that any loader (a recipe's next stage, `jaxagent.evaluate`,
`jaxagent.serve`) prompts it with the bytes it was trained on:

    {"format": "webrl", "options": {"compact": true, "max_prompt_chars": 2048, ...}, "parse": "faithful",
     "chat_template": "{% for message in messages %}..."}
"""

from __future__ import annotations

import json
import os
from typing import Any

from jaxagent.agents.base import AgentFormat, get_format

AGENT_FILE = "agent.json"
_KEYS = {"format": str, "options": dict, "parse": str}


def to_spec(fmt: AgentFormat, chat_template: str | None) -> dict[str, Any]:
  return {"format": fmt.name, "options": fmt.options(), "parse": fmt.parse_rule, "chat_template": chat_template}


def from_spec(spec: dict[str, Any], where: str = AGENT_FILE) -> AgentFormat:
  """The agent format `spec` describes; a missing or mistyped key is a ValueError naming `where` and the key."""
  for key, kind in _KEYS.items():
    if not isinstance(spec.get(key), kind):
      raise ValueError(f"{where}: {key!r} must be a {kind.__name__} (got {spec.get(key)!r}); the training stage "
                       "writes this file: restore it, or pass the format explicitly (--format)")
  try:
    fmt = get_format(spec["format"], **spec["options"])
  except (KeyError, TypeError) as e:
    raise ValueError(f"{where}: cannot build agent format {spec['format']!r} with options {spec['options']}: "
                     f"{e}") from None
  fmt.set_parse_rule(spec["parse"])
  return fmt


def write(directory: str, fmt: AgentFormat, chat_template: str | None) -> str:
  path = os.path.join(directory, AGENT_FILE)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(to_spec(fmt, chat_template), f, indent=2)
  os.replace(tmp, path)
  return path


def read(directory: str) -> dict[str, Any] | None:
  """`directory/agent.json` as a dict; None when there is none (a HF checkpoint, a run from before the file)."""
  path = os.path.join(directory, AGENT_FILE)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    try:
      spec = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}); restore it, or pass --format") from None
  if not isinstance(spec, dict):
    raise ValueError(f"{path}: holds a JSON {type(spec).__name__}, not an object")
  return spec
