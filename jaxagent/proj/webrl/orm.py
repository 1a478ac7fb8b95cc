"""WebRL's outcome reward model (§3.6): a language model asked whether an episode succeeded, answering YES or NO.

Input (`scripts/process_data.py:rm_format`): the intent, every reply of the episode (newlines as "; "), and
the whole HTML the agent saw before its last action (the trace's `html`, not the prompt's cut of it), under the
system prompt `agents.webrl.ORM_SYSTEM_PROMPT`; the system prompt and the user text form the one human turn of a
sample rendered with the model's chat template (the original writes Llama-3's headers around them). A sample
over the model's length keeps its first tokens, as `add_overall_reward`'s `prompt_ids[:, :16384]` and
LLaMA-Factory's `cutoff_len` do: the final page is cut at its end (`fit`), the question and the answer kept.
Score: p = softmax(logit[YES], logit[NO])[YES] at the first reply token where the two answers differ; the label
is 1[p ≥ 0.5]. It is trained, as the seeds' Llama-3.1-8B ORM, as a YES/NO generator (the reply's token NLL) on
programmatically judged episodes.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Sequence

import numpy as np

from jaxagent import types
from jaxagent.agents import webrl as fmt
from jaxagent.data import conversation
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.pipeline import scoring
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.finetune import finetune
from jaxagent.pipeline.policy import inference_mesh
from jaxagent.proj.webrl import data, warmup
from jaxagent.serving.checkpoint import load_policy

ANSWERS = ("YES", "NO")
_SCREEN = "The Current Screenshot:\n"  # `rm_format`'s heading of the final page
PAGES = ("full", "prompt")  # config.orm.page


def near_misses(tasks: Sequence[types.Task], pool: Sequence[types.Task], seed: int) -> list[types.Task]:
  """Each task with the solution (oracle) of a sibling: a pool task of its template with another intent. The
  scripted expert executing it under the task's intent and evaluator makes a fluent episode the judge fails (the
  right category with another order, say): the ORM's negatives that look like its positives. Tasks without a
  sibling are left out."""
  rng = random.Random(seed)
  out = []
  for t in tasks:
    siblings = [p for p in pool if p.template == t.template and p.intent != t.intent]
    if siblings:
      out.append(dataclasses.replace(t, oracle=rng.choice(siblings).oracle))
  return out


HELD_OUT = ("task", "episode")


def split_held_out(judged: Sequence[types.Trajectory], demos: Sequence[types.Trajectory], fraction: float,
                   seed: int, by: str = "task") -> tuple[list[types.Trajectory], list[types.Trajectory]]:
  """(train, held out) for the ORM. `by="task"`: `fraction` of the judged episodes' distinct intents are held
  out with all their episodes, and the demonstrations of those intents leave train too, so every held-out text
  asks about an intent the ORM never trained on (as WebRL's ORM is measured, on held-out tasks). `by="episode"`:
  each judged episode is held out with probability `fraction`; a success's text then usually equals its task's
  demonstration, which is in train. The demonstrations are never held out."""
  if by not in HELD_OUT:
    raise ValueError(f"config.orm.held_out={by!r}: choose one of {HELD_OUT}")
  rng = np.random.default_rng(seed)
  if by == "episode":
    held = rng.random(len(judged)) < fraction
    out = set()
  else:
    intents = sorted({t.task.intent for t in judged})
    out = set(rng.permutation(intents)[:round(len(intents) * fraction)].tolist())
    held = np.array([t.task.intent in out for t in judged], bool)
  train = [t for t, h in zip(judged, held) if not h] + [t for t in demos if t.task.intent not in out]
  return train, [t for t, h in zip(judged, held) if h]


def final_page(traj: types.Trajectory, page: str = "full", compact: bool = False) -> str:
  """The page the agent saw before its last action. `full`: all of it, as `rm_format` reads the last trace line's
  `html` (the stored observation's, through `agents.webrl.compact_html` with `compact`, as the prompts read it);
  `prompt`: as the last step's prompt cut it (`prompt_chars`). Without a stored observation, the prompt's."""
  if page not in PAGES:
    raise ValueError(f"config.orm.page={page!r}: choose one of {PAGES}")
  if not traj.steps:
    return ""
  last = traj.steps[-1]
  if page == "full" and last.observation is not None and last.observation.html:
    return fmt.compact_html(last.observation.html) if compact else last.observation.html
  return fmt.current_html(last.obs_text)


def text_options(config) -> dict:
  """`orm_text`'s options of a run: `orm.page`, and the compact HTML where the actors' prompts have it."""
  return {"page": config.orm.page, "compact": config.html == "compact"}


def orm_text(traj: types.Trajectory, page: str = "full", compact: bool = False) -> str:
  """The ORM's question about one episode (system prompt, then `rm_format`'s user text over `final_page`)."""
  user = fmt.orm_user_content(traj.task.intent, [s.action_text for s in traj.steps],
                              final_page(traj, page, compact))
  return f"{fmt.ORM_SYSTEM_PROMPT}\n\n{user}"


def cut_screen(text: str, chars: int) -> str:
  """An `orm_text` with its final page ("The Current Screenshot") cut to its first `chars` characters."""
  head = text.rfind(_SCREEN)
  return text if head < 0 else text[:head + len(_SCREEN) + chars]


def orm_sample(traj: types.Trajectory, label: bool, sample_id: str = "", **options) -> dict:
  """A YES/NO sample of `orm_text(traj, **options)`."""
  return data.sample(sample_id or traj.task.id, orm_text(traj, **options), ANSWERS[0] if label else ANSWERS[1])


def fit(item: dict, tokenizer, max_len: int) -> dict:
  """`item` (an `orm_sample`) within `max_len` tokens (the scorer's and the trainer's bound, `len(ids) − 1`): its
  final page cut at its end to the longest prefix that fits. The original keeps a prompt's first 16384 tokens
  (`add_overall_reward`; LLaMA-Factory cuts a training prompt's end likewise), so the page's end is what goes;
  here the chat template's closing and the reply stay, so the answer is still read where it is asked. An item that
  fits, or has no page to cut, is returned as it is."""
  def length(text: str) -> int:
    turns = [{**item["conversations"][0], "value": text}, *item["conversations"][1:]]
    return len(conversation.tokenize({**item, "conversations": turns}, tokenizer, 1)[0]) - 1

  text = item["conversations"][0]["value"]
  head = text.rfind(_SCREEN)
  if head < 0 or length(text) <= max_len:
    return item
  start = head + len(_SCREEN)
  lo, hi = 0, len(text) - start  # the longest page prefix that fits lies in [lo, hi)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if length(text[:start + mid]) <= max_len:
      lo = mid
    else:
      hi = mid - 1
  return {**item, "conversations": [{**item["conversations"][0], "value": text[:start + lo]},
                                    *item["conversations"][1:]]}


def answer_ids(tokenizer) -> tuple[int, int, int]:
  """(YES's token, NO's token, how many reply tokens precede them): the first tokens where the two replies
  differ as the chat template writes them (a template may open every reply with a shared space)."""
  seqs = []
  for answer in ANSWERS:
    tokens, _, at = scoring.encode(data.sample("probe", "?", answer), tokenizer)
    seqs.append(tokens[at + 1:])
  k = next((i for i, (a, b) in enumerate(zip(*seqs)) if a != b), None)
  if k is None:
    raise ValueError("the tokenizer writes YES and NO alike; the ORM cannot score")
  return int(seqs[0][k]), int(seqs[1][k]), k


def probabilities(loaded, trajs: Sequence[types.Trajectory], *, batch: int = 8, max_len: int | None = None,
                  **options) -> np.ndarray:
  """p(YES) per episode (`orm_text(t, **options)`, each `fit` to `max_len`): softmax over the YES and NO logits
  where the two replies part."""
  if not trajs:
    return np.zeros(0, np.float32)
  yes, no, offset = answer_ids(loaded.tokenizer)
  items = [orm_sample(t, True, **options) for t in trajs]
  if max_len is not None:
    items = [fit(it, loaded.tokenizer, max_len) for it in items]
  out = scoring.score(loaded, items, batch=batch, max_len=max_len, logit_ids=(yes, no), offset=offset)
  two = out["logits"] - out["logits"].max(-1, keepdims=True)
  p = np.exp(two)
  return (p[:, 0] / p.sum(-1)).astype(np.float32)


def agreement(probs: np.ndarray, verdicts: Sequence[float | None]) -> dict:
  """How often the ORM's label 1[p ≥ 0.5] equals the programmatic verdict, on the episodes that have one; with
  the confusion counts (true/false positives and negatives, the ORM's label against the verdict)."""
  pairs = [(bool(p >= 0.5), v == 1.0) for p, v in zip(np.asarray(probs), verdicts) if v is not None]
  if not pairs:
    return {"episodes": 0, "agreement": None}
  tp = sum(a and b for a, b in pairs)
  tn = sum(not a and not b for a, b in pairs)
  fp = sum(a and not b for a, b in pairs)
  return {"episodes": len(pairs), "agreement": (tp + tn) / len(pairs), "true_positive": tp, "true_negative": tn,
          "false_positive": fp, "false_negative": len(pairs) - tp - tn - fp}


def train(config, workdir: str, out: str, items: list[dict], val: Sequence[types.Trajectory],
          from_policy: bool = True) -> dict:
  """The ORM (`out/model`) fine-tuned on `items` (each `fit` to `data.seq_len`, after its warm-up) from π_0, or
  with `from_policy=False` from `config.model.hf_checkpoint`'s weights (the original's ORM is a model of its own);
  its agreement with the judge on `val`."""
  orm_config = stage_config(config, config.orm, seed_offset=3)
  source = os.path.join(workdir, "sft", "tokenizer")  # π_0's, which `finetune` trains the ORM with
  source = source if from_policy and os.path.isdir(source) else None
  tokenizer = load_tokenizer(source or orm_config.data.tokenizer or orm_config.model.hf_checkpoint or None,
                             require_image_token=False)
  items = [fit(it, tokenizer, int(orm_config.data.seq_len)) for it in items]
  start = warmup.train(config, config.orm, "", items, cut_screen, os.path.join(out, "warmup"),
                       init_from=os.path.join(workdir, "sft") if from_policy else None, seed_offset=3)
  finetune(orm_config, os.path.join(out, "model"), items, init_from=start)
  return agreement(score(config, os.path.join(out, "model"), val), [t.success for t in val])


def score(config, model_dir: str, trajs: Sequence[types.Trajectory]) -> np.ndarray:
  """p(YES) per episode by the ORM in `model_dir` (`probabilities` over the run's `text_options`)."""
  loaded = load_policy(model_dir, mesh=inference_mesh(config))
  return probabilities(loaded, trajs, **data.score_options(config), **text_options(config))
