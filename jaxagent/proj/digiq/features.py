"""Digi-Q's critic inputs from AutoUI text, extracted as `digiq/models/critic.py:VLMDoubleCritic` does (§5.3).

Goal from `Goal: (.*?)</s>`, the previous action from `Previous Actions: (.*?)Goal:`, action type and typed text
from the `"key": "value"` pairs (the raw string for both when the action does not parse), each as hashed text
features for the critic's trainable encoders (`models.critic`), and, with `point_octaves`, each tap's touch and
lift points (see docs/results/digiq.md#critic-features).
"""

from __future__ import annotations

import ast
import re
import zlib
from typing import Mapping, Sequence

import numpy as np

from jaxagent.agents import autoui
from jaxagent.models.critic import CriticConfig


_PREV_RE = re.compile(r"Previous Actions: (.*?)Goal:")
_GOAL_RE = re.compile(r"Goal: (.*?)</s>")


def action_points_parse(fields: Mapping[str, str | None]) -> bool:
  """`VLMDoubleCritic.is_action_valid`: touch and lift points `literal_eval` (weaker than the actor's check)."""
  try:
    ast.literal_eval(fields["touch_point"])
    ast.literal_eval(fields["lift_point"])
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def action_type_and_text(action: str) -> tuple[str, str]:
  """(action_type, typed_text) of an AutoUI action string; the raw string for both when it does not parse
  (`VLMDoubleCritic.parse_action_string`)."""
  fields = autoui.digiq_parse_action(action)
  if action_points_parse(fields):
    return fields["action_type"] or "", fields["typed_text"] or ""
  return action, action


def critic_text_fields(observation: str) -> tuple[str, str]:
  """(previous action, goal) of an AutoUI observation prompt (`VLMDoubleCritic.parse_obs`), "" when absent."""
  prev = _PREV_RE.search(observation)
  goal = _GOAL_RE.search(observation)
  return (prev.group(1) if prev else ""), (goal.group(1) if goal else "")


_WORD_RE = re.compile(r"\w+|[^\w\s]")


def hash_text(text: str, vocab: int, max_tokens: int, trigrams: bool = True) -> list[int]:
  """Hashed features of a text: its lower-cased words then (with `trigrams`) its character trigrams, ids in
  [1, vocab).

  Deterministic across processes (crc32, not Python's salted `hash`); truncated to the first `max_tokens`.
  """
  t = text.lower()
  feats = ["w" + w for w in _WORD_RE.findall(t)]
  if trigrams:
    feats += ["c" + t[i:i + 3] for i in range(max(len(t) - 2, 0))]
  return [1 + zlib.crc32(f.encode("utf-8")) % (vocab - 1) for f in feats[:max_tokens]]


def encode_texts(texts: Sequence[str], vocab: int, max_tokens: int, trigrams: bool = True) -> np.ndarray:
  """int32 [len(texts), max_tokens] of hashed feature ids, 0-padded."""
  out = np.zeros((len(texts), max_tokens), np.int32)
  for i, text in enumerate(texts):
    ids = hash_text(text, vocab, max_tokens, trigrams)
    out[i, :len(ids)] = ids
  return out


def action_point(action: str) -> np.ndarray:
  """float32 [5]: (touch x, touch y, lift x, lift y, 1) of a DUAL_POINT action (an AutoUI decision or the
  critic's previous-action field), zeros for any other action or one that does not parse."""
  fields = autoui.digiq_parse_action(action)
  if fields["action_type"] != "DUAL_POINT":
    return np.zeros(5, np.float32)
  try:
    touch, lift = ast.literal_eval(fields["touch_point"]), ast.literal_eval(fields["lift_point"])
    return np.asarray([*touch, *lift, 1.0], np.float32).reshape(5)
  except Exception:  # pylint: disable=broad-except
    return np.zeros(5, np.float32)


def featurize(observations: Sequence[str], actions: Sequence[str] | Sequence[Sequence[str]],
              cfg: CriticConfig) -> dict[str, np.ndarray]:
  """The critic's text inputs for a batch: goal, prev_type, prev_text [B, L] and act_type, act_text [B, L]
  (one action per state) or [B, N, L] (N candidate actions per state). Image features and `q_rep` are
  added by the caller under `image_features` [B, image_dim] and `q_rep` [B, (N,) rep_dim]."""
  if len(observations) != len(actions):
    raise ValueError(f"featurize: {len(observations)} observations but {len(actions)} actions")
  trigrams = cfg.text_encoder == "pooler"
  enc = lambda xs: encode_texts(xs, cfg.text_vocab, cfg.max_text_tokens, trigrams)
  points = lambda xs: np.stack([action_point(a) for a in xs]) if xs else np.zeros((0, 5), np.float32)
  prevs, goals = zip(*(critic_text_fields(o) for o in observations)) if observations else ((), ())
  prev_type, prev_text = zip(*(action_type_and_text(p) for p in prevs)) if prevs else ((), ())
  batch = {"goal": enc(goals), "prev_type": enc(prev_type), "prev_text": enc(prev_text)}
  if cfg.point_octaves:
    batch["prev_point"] = points(prevs)
  if actions and not isinstance(actions[0], str):
    n = {len(a) for a in actions}
    if len(n) != 1:
      raise ValueError(f"featurize: every state needs the same number of candidate actions, got {sorted(n)}")
    flat = [a for cands in actions for a in cands]
    types, texts = zip(*(action_type_and_text(a) for a in flat))
    per_state = (len(actions), n.pop())
    batch["act_type"] = enc(types).reshape(per_state + (cfg.max_text_tokens,))
    batch["act_text"] = enc(texts).reshape(per_state + (cfg.max_text_tokens,))
    if cfg.point_octaves:
      batch["act_point"] = points(flat).reshape(per_state + (5,))
  else:
    types, texts = zip(*(action_type_and_text(a) for a in actions)) if actions else ((), ())
    batch["act_type"] = enc(types)
    batch["act_text"] = enc(texts)
    if cfg.point_octaves:
      batch["act_point"] = points(list(actions))
  return batch
