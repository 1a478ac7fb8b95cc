"""Acting with SmolLM2-135M-Instruct on the benchmark's prompts: seconds a decision at batch 1 and decisions a
second at batch 8, ours (`pipeline.policy.ModelPolicy`: the batched engine and its KV cache, as every recipe and
`jaxagent.evaluate` act) against PyTorch + transformers `generate` on the same token ids, in the same run.

Workload, the same for both sides: the scripted expert plays headline intents (`bench:text/headline@2`, one a
family in turn) on the text backend, and at each of its steps the prompt is the one a policy acting there reads:
WebRL's (the original's cut) rendered with SmolLM2's chat template, as `configs/webrl.py:smollm,bench=1` acts.
`--decisions` prompts (the first `--steps` of each episode) are answered greedily with up to `--max-tokens` new
tokens, at batch 1 and 8 as an evaluation asks them (`lockstep`: a call holds the next step of each of `batch`
running episodes), each side after one untimed pass over the same calls (compilation; the prefix cache emptied
before each timed pass); with `--repeats N` the sides' timed passes take turns N times and the median pass of each
is reported (this 2-core machine moves ±10 % between passes of the same work). Greedy replies are compared token by
token (a different token is reported, not an error: near-ties may round apart). `--dtype bfloat16` holds and
computes the weights in bfloat16 on both sides (`torch` `.to(bfloat16)`).

  python benchmarks/acting.py [--decisions 16] [--steps 2] [--max-tokens 64] [--torch] [--padded] [--prefix-cache]
      [--continuous] [--dtype bfloat16] [--repeats 3] [--json out.json]

The issue's targets (issue 60): ≤ 1.5 s a decision at batch 1, and at batch 8 ≥ 4× batch 1's decisions a second.
The hardware's limit is printed beside: each prompt's prefill FLOPs (`models.flops`, the one logit row it needs)
at the matmul rate measured in the same run, a floor no batch size lowers, since the prefill's work grows with rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import time
from typing import Iterator

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's jaxagent

# pylint: disable=g-import-not-at-top,wrong-import-position
from jaxagent import host_memory
from jaxagent.agents.webrl import WebRL
from jaxagent.envs.sites import bench, expert
from jaxagent.envs.sites.text_env import SiteTextEnv
from jaxagent.models import flops
from jaxagent.models.hf import gguf
from jaxagent.models.hf import llama as hf_llama
from jaxagent.pipeline.policy import ModelPolicy
from jaxagent.serving.checkpoint import load_policy
from jaxagent.serving.continuous import ContinuousEngine
from jaxagent.serving.engine import Engine, GenerationRequest
from jaxagent.train import mfu
from jaxagent.types import Step


def episode_prompts(policy: ModelPolicy) -> Iterator[list[str]]:
  """Each episode's prompts, in order, that `policy` reads while the scripted expert plays headline intents on the
  text backend (one a family in turn)."""
  tasks = bench.tasks_for("text/headline@2")
  by_family: dict[str, list] = {}
  for task in tasks:
    by_family.setdefault(task.meta["family"], []).append(task)
  order = [t for group in zip(*by_family.values()) for t in group]  # one a family in turn
  guide = expert.ScriptedExpert("webrl")
  with SiteTextEnv(profile="text", oracle_targets=True) as env:
    for task in order:
      obs, history, prompts = env.reset(task), [], []
      for k in range(task.max_steps):
        prompts.append(policy.prompt(obs, history)[0])
        text = guide.act([obs], [history])[0]
        action = guide.fmt.parse(text)
        history.append(Step(step=k, action_text=text, action=action))
        obs, _, done, _ = env.step(action)
        if done:
          break
      yield prompts


def benchmark_episodes(policy: ModelPolicy, n: int, steps: int) -> list[list[str]]:
  """Episodes of `episode_prompts`, each cut to its first `steps` prompts, until they hold `n` prompts."""
  episodes, total = [], 0
  for episode in episode_prompts(policy):
    episodes.append(episode[:min(steps, n - total)])
    total += len(episodes[-1])
    if total >= n:
      break
  return episodes


def lockstep(episodes: list[list[str]], batch: int) -> list[list[int]]:
  """The calls a policy acting on `batch` episodes at once makes, as indices into the episodes' prompts laid end
  to end: each call holds the next step of every running episode, and an episode that ends hands its place to the
  next one (so an episode's steps come in order, one a call, as an evaluation asks them)."""
  starts = np.cumsum([0] + [len(e) for e in episodes])
  queue = list(range(len(episodes)))
  running: list[list[int]] = []  # each slot: its episode's prompt indices still to ask
  calls = []
  while queue or any(running):
    running = [r for r in running if r]
    while len(running) < batch and queue:
      e = queue.pop(0)
      running.append(list(range(starts[e], starts[e + 1])))
    calls.append([r.pop(0) for r in running])
  return calls


def shared_prefix(policy: ModelPolicy, intents: int) -> dict:
  """How many of a step's prompt tokens the episode's previous prompt began with: what a prefix cache could skip."""
  shared, tokens = [], []
  for episode in itertools.islice(episode_prompts(policy), intents):
    ids = [policy.engine.prepare(GenerationRequest(prompt=p, max_tokens=1)).ids for p in episode]
    for prev, cur in zip(ids, ids[1:]):
      n = min(len(prev), len(cur))
      shared.append(next((i for i in range(n) if prev[i] != cur[i]), n))
      tokens.append(len(cur))
  return {"intents": intents, "steps": len(tokens), "mean_tokens": float(np.mean(tokens)),
          "mean_shared": float(np.mean(shared)), "fraction": float(np.sum(shared) / np.sum(tokens))}


def prefill_flops(cfg, tokens: int) -> float:
  """A prompt's prefill in the weights and the causal attention, its logits at the last token only."""
  head = 2.0 * cfg.vocab_size * cfg.hidden_size
  return tokens * (flops.decoder_flops_per_token(cfg, tokens, training=False) - head) + head


class _Side:
  """One way of acting, timed: `run(rows)` → each row's reply tokens, over `items` asked in `calls` (lists of
  indices). `warm()` makes one untimed pass (compilation); each `timed()` pass first calls `before_timing()` (a
  cache the earlier pass filled emptied). `result()`: the median pass, and its tokens."""

  def __init__(self, run, items: list, calls: list[list[int]], before_timing=lambda: None, stats=lambda: {}):
    self.run, self.items, self.calls, self.before_timing, self.stats = run, items, calls, before_timing, stats
    self.passes: list[list[float]] = []
    self.first_pass_seconds = 0.0
    self.tokens: list = []

  def warm(self) -> None:
    t0 = time.perf_counter()
    for call in self.calls:
      self.run([self.items[i] for i in call])
    self.first_pass_seconds = time.perf_counter() - t0

  def timed(self) -> None:
    self.before_timing()
    times, tokens = [], [None] * len(self.items)
    for call in self.calls:
      t0 = time.perf_counter()
      for i, reply in zip(call, self.run([self.items[i] for i in call])):
        tokens[i] = reply
      times.append(time.perf_counter() - t0)
    self.passes.append(times)
    self.tokens = tokens

  def result(self) -> dict:
    totals = [sum(t) for t in self.passes]
    times = self.passes[totals.index(statistics.median_low(totals))]
    n = len(self.items)
    return {"batch": max(len(c) for c in self.calls), "calls": len(self.calls), "decisions": n,
            "seconds": sum(times), "passes_seconds": totals, "first_pass_seconds": self.first_pass_seconds,
            "seconds_per_decision": sum(times) / n, "decisions_per_s": n / sum(times),
            "median_call_s": statistics.median(times), "tokens": self.tokens, "engine_stats": dict(self.stats())}


def measure_ours(policy: ModelPolicy, prompts: list[str], calls: list[list[int]]) -> _Side:
  return _Side(lambda rows: [list(getattr(o, "reply_ids", [])) for o in policy.generate(rows)],
               [(p, []) for p in prompts], calls, policy.engine.clear_prefix_cache, policy.engine.stats)


def measure_continuous(policy: ModelPolicy, prompts: list[str], calls: list[list[int]], max_tokens: int,
                       closing: list) -> _Side:
  """`batch` prompts submitted at once to the server's engine (`serving.continuous`): each prefilled alone at its
  own width, then decoded together."""
  engine = ContinuousEngine(policy.engine, max_batch=max(len(c) for c in calls))
  requests = [GenerationRequest(prompt=p, **dict(policy.sampling, max_tokens=max_tokens, temperature=0.0))
              for p in prompts]  # as `ModelPolicy.generate` asks its engine

  def run(rows):
    return [list(f.result().tokens) for f in [engine.submit(r) for r in rows]]

  closing.append(engine.close)
  return _Side(run, requests, calls)


def measure_torch(hf_dir: str, ids: list[np.ndarray], calls: list[list[int]], max_tokens: int, eos: list[int],
                  pad: int, dtype: str = "float32") -> _Side:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).eval()

  def run(rows: list[np.ndarray]) -> list[list[int]]:
    width = max(len(r) for r in rows)  # left padding, as `generate` wants for a decoder
    x = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
      x[i, width - len(r):] = torch.from_numpy(r.astype(np.int64))
      mask[i, width - len(r):] = 1
    with torch.inference_mode():
      out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                           eos_token_id=eos, pad_token_id=pad)
    replies = []
    for row in out[:, width:].tolist():
      end = next((k for k, t in enumerate(row) if t in eos), None)  # the EOS kept, as our engine keeps it
      replies.append(row if end is None else row[:end + 1])
    return replies

  return _Side(run, ids, calls)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--decisions", type=int, default=16, help="prompts answered at each batch size")
  parser.add_argument("--max-tokens", type=int, default=64, help="new tokens at most a reply")
  parser.add_argument("--steps", type=int, default=2,
                      help="prompts an episode at most (its first steps): episodes enough to fill every batch size")
  parser.add_argument("--batches", default="1,8", help="batch sizes (episodes acted on at once), comma-separated")
  parser.add_argument("--torch", action="store_true", help="also PyTorch + transformers `generate`, same run")
  parser.add_argument("--padded", action="store_true",
                      help="also the engine with one padded prefill a call (`prefill=\"batch\"`: "
                           "the path before rows were prefilled at their own widths), same run")
  parser.add_argument("--prefix-cache", action="store_true",
                      help="also the engine with the prefix cache (`prefix_cache_bytes`: an episode's next prompt "
                           "prefilled from where it departs from the previous one), same run")
  parser.add_argument("--continuous", action="store_true",
                      help="also the server's continuous engine (each row prefilled at its own width), same run")
  parser.add_argument("--prefix-intents", type=int, default=24,
                      help="intents over which to count the prompt tokens a step shares with the previous (0: skip)")
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                      help="the weights' storage and compute dtype, both sides")
  parser.add_argument("--repeats", type=int, default=1,
                      help="timed passes of each side, in turn (the median pass is reported)")
  parser.add_argument("--json", default="", help="where to write the figures (optional)")
  args = parser.parse_args(argv)
  if args.repeats < 1:
    parser.error(f"--repeats={args.repeats} must be ≥ 1")
  host_memory.keep_freed_memory()  # as `jaxagent.main` runs: freed buffers reused, not mapped afresh
  sizes = [int(b) for b in args.batches.split(",")]
  hf_dir = gguf.smollm2_hf_dir()
  loaded = load_policy(hf_dir)
  if args.dtype != "float32":
    loaded = dataclasses.replace(loaded, model=hf_llama.load_pretrained(hf_dir, dtype=args.dtype,
                                                                        param_dtype=args.dtype)[0])
  engine = lambda **kw: Engine(loaded, max_batch=max(sizes), max_new_tokens=args.max_tokens, **kw)
  policy = ModelPolicy(loaded, WebRL(), engine(), temperature=0.0, max_tokens=args.max_tokens)
  episodes = benchmark_episodes(policy, args.decisions, args.steps)
  prompts = [p for e in episodes for p in e]
  calls = {b: lockstep(episodes, b) for b in sizes}
  ids = [policy.engine.prepare(GenerationRequest(prompt=p, max_tokens=args.max_tokens, temperature=0.0)).ids
         for p in prompts]  # the ids our engine samples from: PyTorch gets the same
  out = {"machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": mfu.processor_name(),
                     "jax": jax.__version__}, "dtype": args.dtype,
         "model": hf_dir, "decisions": len(prompts), "episodes": len(episodes), "max_tokens": args.max_tokens,
         "prompt_tokens": {"mean": float(np.mean([len(i) for i in ids])), "max": int(max(len(i) for i in ids))},
         "repeats": args.repeats}
  rate = mfu.measured_matmul_flops(n=2048, dtype=args.dtype)
  floor = sum(prefill_flops(loaded.model.config, len(i)) for i in ids) / rate / len(ids)
  out["hardware"] = {"matmul_flops": rate, "prefill_floor_s_per_decision": floor}
  others = {}  # name → (what the printed line calls it, its side at a batch size)
  if args.padded:
    padded = ModelPolicy(loaded, WebRL(), engine(prefill="batch"), temperature=0.0, max_tokens=args.max_tokens)
    others["padded"] = ("one padded prefill", lambda b: measure_ours(padded, prompts, calls[b]))
  if args.prefix_cache:
    cached = ModelPolicy(loaded, WebRL(), engine(prefix_cache_bytes=2 << 30), temperature=0.0,
                         max_tokens=args.max_tokens)
    others["prefix_cache"] = ("with the prefix cache", lambda b: measure_ours(cached, prompts, calls[b]))
  closing: list = []
  if args.continuous:
    others["continuous"] = ("continuous engine",
                            lambda b: measure_continuous(policy, prompts, calls[b], args.max_tokens, closing))
  if args.torch:
    import torch  # pylint: disable=g-import-not-at-top
    torch.set_num_threads(os.cpu_count() or 1)
    eos = sorted(int(e) for e in loaded.eos_ids)
    out["torch_version"] = torch.__version__
    others["torch"] = ("PyTorch `generate`",
                       lambda b: measure_torch(hf_dir, ids, calls[b], args.max_tokens, eos, int(loaded.pad_id),
                                               args.dtype))
  out["ours"] = {}
  for name in others:
    out[name] = {}
  try:
    for b in sizes:  # every side warmed, then their timed passes in turn: a drift of the machine reaches all
      sides = {"ours": measure_ours(policy, prompts, calls[b]), **{n: m(b) for n, (_, m) in others.items()}}
      for side in sides.values():
        side.warm()
      for _ in range(args.repeats):
        for side in sides.values():
          side.timed()
      for name, side in sides.items():
        out[name][str(b)] = side.result()
  finally:
    for close in closing:
      close()
  for name in others:
    for b in sizes:
      theirs, ours = out[name][str(b)], out["ours"][str(b)]
      theirs["same_reply_as_ours"] = sum(a == r for a, r in zip(theirs["tokens"], ours["tokens"]))
      theirs["ours_speedup"] = theirs["seconds"] / ours["seconds"]
  if args.prefix_intents:
    out["shared_prefix"] = shared_prefix(policy, args.prefix_intents)
  one = out["ours"][str(sizes[0])]
  print(f"SmolLM2-135M acting on {len(prompts)} benchmark prompts of {len(episodes)} episodes "
        f"({out['prompt_tokens']['mean']:.0f} tokens on average, {out['prompt_tokens']['max']} at most), up to "
        f"{args.max_tokens} new tokens, greedy; {out['machine']['processor']}, {out['machine']['cpu_count']} cores; "
        f"the prefill alone at the measured {rate / 1e9:.0f} GFLOP/s: {floor:.2f} s a decision")
  for b in sizes:
    r = out["ours"][str(b)]
    line = (f"  batch {b}: {r['seconds_per_decision']:.2f} s a decision, {r['decisions_per_s']:.2f} decisions/s "
            f"({r['decisions_per_s'] / one['decisions_per_s']:.2f}x batch {sizes[0]}; first pass "
            f"{r['first_pass_seconds']:.1f} s; {r['seconds_per_decision'] / floor:.2f}x the prefill's floor)")
    for name, (label, _) in others.items():
      t = out[name][str(b)]
      line += (f"; {label} {t['seconds_per_decision']:.2f} s a decision: ours {t['ours_speedup']:.2f}x, "
               f"{t['same_reply_as_ours']} of {len(prompts)} replies the same tokens")
      if "prefix_tokens_reused" in t["engine_stats"]:
        line += f" ({t['engine_stats']['prefix_tokens_reused'] / (1 + args.repeats):.0f} prompt tokens skipped a pass)"
    print(line)
  if "shared_prefix" in out:
    sp = out["shared_prefix"]
    print(f"  a step's prompt begins with {sp['mean_shared']:.0f} of its {sp['mean_tokens']:.0f} tokens as the "
          f"episode's previous one did ({sp['fraction']:.0%}; {sp['steps']} steps of {sp['intents']} intents): "
          f"the most a prefix cache skips")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
