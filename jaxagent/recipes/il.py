"""Imitation learning (OpenWebVoyager stage 1, `reference/algorithms.md` §2.3–2.5):
`python -m jaxagent.main --config=configs/il.py --workdir=DIR`.

Supervised fine-tuning of the policy on teacher conversations, masked next-token cross-entropy on the assistant
turns only (§2.5), through `pipeline.finetune`. The data: `config.data.path` (OWV JSON/JSONL), else synthetic
conversations generated once into `<workdir>/data`. A conversation longer than `data.seq_len` is cut there.
"""

from __future__ import annotations

import os

import jax
from jax.experimental import multihost_utils

from jaxagent.agents.openwebvoyager import OpenWebVoyager
from jaxagent.data import conversation, synthetic_conversations
from jaxagent.pipeline.finetune import finetune

CHOICES = {"model.kind": ("vlm", "decoder")}


def load_items(config, workdir: str) -> list[dict]:
  """The conversations: `config.data.path`, else synthetic ones generated (once) into `<workdir>/data`."""
  path = config.data.path
  if not path:
    path = os.path.join(workdir, "data", "conversations.json")
    if jax.process_index() == 0 and not os.path.exists(path):
      synthetic_conversations.generate(os.path.dirname(path), config.data.synthetic_episodes,
                                       seed=int(config.seed))
    if jax.process_count() > 1:  # the others read what process 0 wrote to the shared workdir
      multihost_utils.sync_global_devices("il_synthetic_data")
  return conversation.load_conversations(path)


def run(config, workdir: str) -> str:
  # The conversations are OpenWebVoyager's (turns, ≤3 screenshots, WebVoyager's action grammar): the actor acts so.
  path = finetune(config, workdir, load_items(config, workdir), agent=OpenWebVoyager(), truncate=True)
  print(f"IL done: final checkpoint {path}")
  return path
