"""One factory for the engine that runs a loaded model: the learner and the policies never branch on it."""

from __future__ import annotations

from jaxagent.models import qwen_vl
from jaxagent.serving.checkpoint import LoadedModel
from jaxagent.serving.engine import Engine
from jaxagent.serving.qwen_engine import QwenVLEngine
from jaxagent.serving.seq2seq_engine import Seq2SeqEngine


def engine_for(loaded: LoadedModel, **kwargs) -> Engine | QwenVLEngine | Seq2SeqEngine:
  """`Seq2SeqEngine` for an AutoUI encoder-decoder, `QwenVLEngine` for Qwen2.5-VL, `Engine` for the decoders and
  the other VLMs; `kwargs`: `max_batch`, `max_new_tokens`, `seed` (and the engine's own: `Engine`'s
  `prefix_cache_bytes`, refused for the other two)."""
  if kwargs.get("prefix_cache_bytes") and (loaded.kind == "autoui" or qwen_vl.is_qwen(loaded)):
    raise ValueError(f"prefix_cache_bytes: the prefix cache keeps a decoder's keys; this {loaded.kind} model "
                     "acts through its own engine, which has none (pass 0)")
  if loaded.kind == "autoui":
    return Seq2SeqEngine(loaded, **kwargs)
  return (QwenVLEngine if qwen_vl.is_qwen(loaded) else Engine)(loaded, **kwargs)
