"""Pre-training the project's own small base: grounding and copying on worlds the benchmark never evaluates.

  python -m jaxagent.main --config=configs/pretrain.py --workdir=W

Stages:
  corpus     skill queries on pages of the pre-training worlds (`proj.pretrain.corpus`) and, apart, the probes'
             on held-out worlds; never a benchmark intent or demonstration
  tokenizer  a byte-level BPE fitted on the corpus, so that the sites' names and ids take few tokens
  warmup     the same skills on windows of the pages (`corpus.window_chars`) in short packed rows
             (`warmup.seq_len`): where a small model first learns to look a name up and copy a string
  train      causal-LM training on the whole pages' conversations from the warm-up's weights, samples packed into
             rows (`data.packing`), loss on the replies (`loss_on`), through the shared loop (sharded, resumable,
             TensorBoard, a progress bar)
  export     the model as a Hugging Face directory (`W/export/base`): what `model.base` points every recipe at
  probes     greedy replies on the held-out worlds' queries: grounding (the id of the named element) and copying
             (the typed or answered string), per skill and per format (`corpus.format`)

A recipe names the base with `--config.model.base=pretrain` (built once into the cache by `ensure_base`, keyed by
this config's content) or `--config.model.base=DIR` (an export or any HF directory).
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
import os
import random

import numpy as np

from jaxagent import models
from jaxagent.data import conversation, packing, pipeline, tokenizer as tokenizer_lib
from jaxagent.pipeline.config import stage_config
from jaxagent.pipeline.stages import Stages, write_json, write_text
from jaxagent.proj.pretrain import corpus, targets
from jaxagent.proj.pretrain.scoring import probe_format, probe_group, probe_scores
from jaxagent.serving.checkpoint import export_policy, load_policy
from jaxagent.train import loop
from jaxagent.train.losses import sparse_token_nll, weighted_token_nll

STAGES = ("corpus", "tokenizer", "warmup", "train", "export", "probes")
CHOICES = {"loss_on": ("reply", "all")}
LISTS = {"corpus.format": corpus.FORMATS}


def check_config(config) -> None:
  """The pre-training and probe worlds lie above every evaluation world and apart from each other."""
  corpus.check_worlds("corpus.worlds", int(config.corpus.worlds.first), int(config.corpus.worlds.count))
  corpus.check_worlds("probes.worlds", int(config.probes.worlds.first), int(config.probes.worlds.count))
  a, b = config.corpus.worlds, config.probes.worlds
  if a.first < b.first + b.count and b.first < a.first + a.count:
    raise ValueError(f"config.probes.worlds ({b.first}..{b.first + b.count - 1}) overlap config.corpus.worlds "
                     f"({a.first}..{a.first + a.count - 1}): the probes must be on worlds pre-training never saw")
  t, d = config.targets, config.model.decoder
  if int(d.hidden_size) % int(d.num_heads):  # the base exports as a Hugging Face Llama, which refuses it on load
    raise ValueError(f"config.model.decoder.hidden_size={d.hidden_size} is not a multiple of num_heads="
                     f"{d.num_heads}: the base exports as a Llama checkpoint; change either")
  for key in ("weight", "copy_init", "pointer", "gate"):
    if float(t.get(key, 0.0)) < 0:
      raise ValueError(f"config.targets.{key}={t[key]} must be >= 0")
  if float(t.weight) and config.loss_on != "reply":
    raise ValueError(f"config.targets.weight={t.weight} reads the replies' loss positions; set --config.loss_on=reply "
                     "or --config.targets.weight=0")
  for key in ("reply_layer", "name_layer"):
    if not -int(d.num_layers) <= int(t[key]) < int(d.num_layers):
      raise ValueError(f"config.targets.{key}={t[key]}: the decoder has {d.num_layers} layers")
  layer = lambda key: int(t[key]) % int(d.num_layers)
  if int(t.name_heads) and layer("name_layer") in {layer("reply_layer"), 0 if int(t.link_heads) else -1}:
    raise ValueError(f"config.targets.name_layer={t.name_layer}: the name heads need a layer of their own (the reply "
                     f"heads are in layer {layer('reply_layer')}, the link heads in 0); with "
                     f"{d.num_layers} layers set it to 1, or --config.targets.name_heads=0")
  for key in ("reply_heads", "link_heads", "name_heads", "previous_heads", "span_heads"):
    if not 0 <= int(t[key]) <= int(d.num_heads):
      raise ValueError(f"config.targets.{key}={t[key]}: between 0 and model.decoder.num_heads={d.num_heads}")
  targets.check_layer0_heads(d, t)
  for key, known in (("skills", tuple(corpus.SKILLS)), ("quotes", tuple(corpus.QUOTES))):
    names = _names(config.corpus[key])
    if not names or set(names) - set(known):
      raise ValueError(f"config.corpus.{key}={config.corpus[key]!r}: name one or more of {known}")
  for fmt in _names(config.corpus.format):
    if fmt not in corpus.FORMATS:  # also main's check (LISTS); a cached base's build runs this one alone
      raise ValueError(f"config.corpus.format={config.corpus.format!r}: name one or more of {corpus.FORMATS}")
    if not corpus.format_skills(fmt, _names(config.corpus.skills)):
      raise ValueError(f"config.corpus.skills={config.corpus.skills!r}: none of them is asked in the format {fmt!r} "
                       f"(corpus.format), which asks {corpus.FORMAT_SKILLS[fmt]}; add one")


def run(config, workdir: str) -> dict:
  stages = Stages(workdir, "pretrain", config)
  stages.run("corpus", lambda out: stage_corpus(config, out))
  stages.run("tokenizer", lambda out: stage_tokenizer(config, workdir, out))
  stages.run("warmup", lambda out: train_on(config, config.warmup, workdir, "windows", out, None))
  stages.run("train", lambda out: train_on(config, config.pretrain, workdir, "samples", out,
                                            os.path.join(workdir, "warmup") if config.warmup.train.steps else None))
  stages.run("export", lambda out: {"base": export_policy(os.path.join(workdir, "train"), os.path.join(out, "base"))})
  results = stages.run("probes", lambda out: stage_probes(config, workdir, out))
  write_json(os.path.join(workdir, "results.json"), results)
  print(json.dumps(results, indent=1))
  print(stages.table())
  return results


# ------------------------------------------------------------------------------------------ stages


def _names(value: str) -> tuple[str, ...]:
  """A comma-separated config value's names, in order, repeats kept (`corpus.skills` weights by them)."""
  return tuple(s.strip() for s in value.split(",") if s.strip())


def stage_corpus(config, out):
  c, skills, quotes = config.corpus, _names(config.corpus.skills), _names(config.corpus.quotes)
  formats = dict(formats=_names(c.format), page_chars=int(c.page_chars))
  train, windows = corpus.samples(
      int(c.worlds.first), int(c.worlds.count), walks_per_world=int(c.walks_per_world), walk_steps=int(c.walk_steps),
      sample_chars=int(c.sample_chars), skills=skills, max_prompt_chars=int(c.prompt_chars), seed=int(config.seed),
      window_chars=int(c.window_chars), windows_per_page=int(c.windows_per_page) if config.warmup.train.steps else 0,
      window_sample_chars=int(c.window_sample_chars), quotes=quotes, **formats)
  p = config.probes
  probes = corpus.examples(int(p.worlds.first), int(p.worlds.count), walks_per_world=int(p.walks_per_world),
                           walk_steps=int(c.walk_steps), per_page=1, skills=tuple(dict.fromkeys(skills)),
                           max_prompt_chars=int(c.prompt_chars), seed=int(config.seed) + 1, quotes=quotes, **formats)
  probes = random.Random(int(config.seed)).sample(probes, min(len(probes), int(p.examples)))
  for name, items in (("samples", train), ("windows", windows)):
    with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
      for item in items:
        f.write(json.dumps(item, ensure_ascii=False) + "\n")
  with open(os.path.join(out, "probes.jsonl"), "w", encoding="utf-8") as f:
    for k, ex in enumerate(probes):
      f.write(json.dumps({**ex.sample(f"probe-{k}"), "skill": ex.skill, "element": ex.element, "text": ex.text,
                          "style": ex.style, "format": ex.format}, ensure_ascii=False) + "\n")
  replies = [t["value"] for it in train for t in it["conversations"][1::2]]
  return {"samples": len(train), "windows": len(windows), "replies": len(replies), "probes": len(probes),
          "probe_skills": dict(collections.Counter(probe_group(ex.__dict__) for ex in probes)),
          "mean_chars": float(np.mean([sum(len(t["value"]) for t in it["conversations"]) for it in train]))}


def _read(workdir: str, name: str) -> list[dict]:
  with open(os.path.join(workdir, "corpus", f"{name}.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def stage_tokenizer(config, workdir, out):
  items = _read(workdir, "samples")
  path = tokenizer_lib.fit_tokenizer(os.path.join(out, "tokenizer"), conversation.texts(items[:4000]),
                                     int(config.data.vocab_size), html=True)
  tok = tokenizer_lib.load_tokenizer(path, require_image_token=False)
  sample = items[:200]
  chars = sum(len(t) for t in conversation.texts(sample))
  tokens = sum(len(tok(t)["input_ids"]) for t in conversation.texts(sample))
  return {"path": path, "vocab": len(tok), "chars_per_token": chars / max(tokens, 1)}


def train_on(config, section, workdir: str, corpus_name: str, out: str, init_from: str | None) -> dict:
  """Trains the base on the corpus file `corpus_name` with the stage `section` (its `train`, `optim` and
  `seq_len`, else `data.seq_len`), from `init_from`'s weights or from scratch; the workdir loads as a policy."""
  if not int(section.train.steps):
    return {"skipped": "no steps"}
  tok = tokenizer_lib.load_tokenizer(os.path.join(workdir, "tokenizer", "tokenizer"), require_image_token=False)
  train_config = stage_config(config, section)
  seq_len = int(section.get("seq_len", config.data.seq_len))
  tok.save_pretrained(os.path.join(out, "tokenizer"))
  write_text(os.path.join(out, "config.json"), train_config.to_json_best_effort(indent=2))
  encoded, dropped = [], 0
  for item in _read(workdir, corpus_name):
    ids, loss = conversation.tokenize(item, tok, 1)
    if len(ids) > seq_len + 1:  # a cut sample would lose its reply
      dropped += 1
      continue
    encoded.append((ids, loss if config.loss_on == "reply" else np.ones_like(loss)))
  if not encoded:
    raise ValueError(f"pretrain: no {corpus_name} sample fits {seq_len} tokens; raise config.data.seq_len")
  rows = packing.pack(encoded, seq_len, pad_id=int(tok.pad_token_id))
  built = models.build(train_config, tok)
  # the loss on the replies alone reads logits at those positions only
  most = int(rows["loss_mask"].sum(1).max())
  loss = sparse_token_nll(most) if config.loss_on == "reply" else weighted_token_nll
  model_fn, t = built.init, config.targets
  if float(t.weight):
    rows.update(targets.target_rows(encoded, [tok.decode([i]) for i in range(len(tok))], seq_len))
    loss = targets.pretrain_loss(most, t, {f: max(1, int((rows[f] > 0).sum(1).max())) for f in targets.FIELDS})
    if float(t.copy_init) and not init_from:
      model_fn = lambda: _copy_heads(config, built.init())
  ds = pipeline.rows_dataset(rows, batch_size=int(train_config.train.batch_size), seed=int(train_config.seed))
  pretrained = (lambda: loop.on_host(load_policy(init_from).model)) if init_from else None
  loop.train(train_config, out, model_fn=model_fn, loss_fn=loss, dataset=ds, pretrained=pretrained,
             flops_per_token=built.flops_per_token, read_options=pipeline.read_options(int(config.data.num_threads)))
  return {"rows": len(rows["input_ids"]), "fill": packing.fill(rows), "samples": len(encoded), "dropped": dropped,
          "tokens": int((rows["segment_ids"] > 0).sum()),
          "epochs": int(train_config.train.steps) * int(train_config.train.batch_size) / len(rows["input_ids"])}


def _copy_heads(config, model):
  """`model` with the targets' reply and link heads starting as copies (`targets.copy_init`)."""
  t, seed = config.targets, int(config.seed)
  layer = int(t.reply_layer) % int(config.model.decoder.num_layers)
  model = targets.copy_heads(model, layer, int(t.reply_heads), float(t.copy_init), seed)
  model = targets.copy_heads(model, 0, int(t.link_heads), float(t.copy_init), seed + 1)
  name_layer = int(t.name_layer) % int(config.model.decoder.num_layers)
  return targets.copy_heads(model, name_layer, int(t.name_heads), float(t.copy_init), seed + 2)


def stage_probes(config, workdir, out):
  """Greedy replies to the held-out worlds' queries: the grounding accuracy (the reply names the element's id)
  and the copy accuracy (the reply's typed or answered string is the one asked), per skill."""
  from jaxagent.serving.engine import Engine, GenerationRequest  # pylint: disable=g-import-not-at-top
  policy = load_policy(os.path.join(workdir, "export", "base"))
  engine = Engine(policy, max_batch=int(config.probes.batch), max_new_tokens=int(config.probes.max_tokens))
  items = _read(workdir, "probes")
  requests = [GenerationRequest(prompt=engine.training_prompt(it["conversations"][:1]),
                                max_tokens=int(config.probes.max_tokens), temperature=0.0) for it in items]
  replies = [r.text for r in engine.generate(requests)]
  per = {by: collections.defaultdict(lambda: collections.defaultdict(list)) for by in ("skill", "style", "format")}
  rows = []
  for it, reply in zip(items, replies):
    groups = {"skill": probe_group(it), "style": it.get("style", "straight"), "format": it.get("format", "webrl")}
    for key, value in probe_scores(probe_format(it), it, reply).items():
      for by, group in groups.items():
        per[by][group][key].append(value)
    rows.append({"id": it["id"], "skill": it["skill"], "reply": reply, "want": it["conversations"][1]["value"]})
  write_json(os.path.join(out, "replies.json"), rows)
  table = lambda per: {name: {k: float(np.mean(v)) for k, v in m.items()} | {"n": len(m["exact"])}
                       for name, m in sorted(per.items())}
  pooled = lambda key: [x for m in per["skill"].values() for x in m.get(key, [])]
  mean = lambda key: float(np.mean(pooled(key))) if pooled(key) else float("nan")
  return {"grounding": mean("grounding"), "copy": mean("copy"), "run_on": mean("run_on"), "exact": mean("exact"),
          "n": len(items), "by_skill": table(per["skill"]), "by_style": table(per["style"]),
          "by_format": table(per["format"])}


# ------------------------------------------------------------------------------------------ the base for recipes


def base_key(config) -> str:
  """A short hash of what makes the base: the pre-training config and the corpus generator's source."""
  blob = json.dumps(config.to_dict(), sort_keys=True, default=str)
  return hashlib.sha1(f"{inspect.getsource(corpus)}{blob}".encode()).hexdigest()[:12]


def load_config(arg: str = ""):
  """`configs/pretrain.py[:arg]` of this checkout (the file beside the package)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "configs", "pretrain.py")
  if not os.path.exists(path):
    raise ValueError(f"config.model.base=pretrain builds from configs/pretrain.py, not found at {path} (an "
                     "installed package without its checkout); set --config.model.base to a base's directory")
  spec = importlib.util.spec_from_file_location("jaxagent_configs_pretrain", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg or None)


def ensure_base(arg: str = "") -> str:
  """The exported base of `configs/pretrain.py[:arg]`, built once (with a progress bar) into the cache, keyed by
  its config's content; returns its HF directory."""
  config = load_config(arg)
  workdir = os.path.join(tokenizer_lib.cache_dir(), f"base-{base_key(config)}")
  base = os.path.join(workdir, "export", "base")
  if not os.path.exists(os.path.join(workdir, "probes", "DONE")):
    print(f"model.base: building the pre-trained base into {workdir} (once; configs/pretrain.py)")
    os.makedirs(workdir, exist_ok=True)
    write_json(os.path.join(workdir, "config.json"), config.to_dict())
    check_config(config)
    run(config, workdir)
  return base


def resolve(config) -> None:
  """`config.model.base` as the checkpoint recipes start from: "pretrain" (or "pretrain:ARG") builds or reuses the
  cached base; a directory is taken as it is. Sets `model.hf_checkpoint` to it (the weights, architecture and
  tokenizer every recipe already reads from there)."""
  base = config.model.get("base", "")
  if not base:
    return
  if config.model.hf_checkpoint:
    raise ValueError(f"config.model.base={base!r} and config.model.hf_checkpoint={config.model.hf_checkpoint!r} "
                     "both name a start; set one of them (--config.model.hf_checkpoint='')")
  if base == "pretrain" or base.startswith("pretrain:"):
    path = ensure_base(base.partition(":")[2])
  elif os.path.isdir(base):
    path = base
  else:
    raise ValueError(f"config.model.base={base!r} is neither 'pretrain' nor a directory; set "
                     "--config.model.base=pretrain (the cached base) or a base's export directory")
  if not os.path.exists(os.path.join(path, "config.json")):
    raise ValueError(f"config.model.base={base!r}: {path} holds no config.json (an exported base has one)")
  with config.unlocked():
    config.model.hf_checkpoint = path
    if config.get("data") is not None and "tokenizer" in config.data:
      config.data.tokenizer = ""  # the base's own
