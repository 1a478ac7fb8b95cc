"""The SFT's and the ORM's warm-up: a few steps on their samples with each page cut short, before the full pages.

A decoder trained from scratch learns to look from its reply back to the intent's words over ~100 tokens, and
keeps doing so over the full ~750, where on full pages alone it does not learn it at all
(docs/results/webrl.md#warmup): short inputs first, as Shortformer's staged training (Press et al., 2021). Not
in the original, which starts from a pretrained Llama.
"""

from __future__ import annotations

from typing import Callable

from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune


def train(config, section, tokenizer: str, items: list[dict], cut: Callable[[str, int], str], out: str,
          init_from: str | None = None, seed_offset: int = 0) -> str | None:
  """A stage's start: `section.warmup.steps` steps on its samples with each page cut by `cut` to
  `section.warmup.prompt_chars` characters, from `init_from`; returns where the stage starts (`init_from` when off)."""
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
