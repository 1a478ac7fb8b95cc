"""Policy-server throughput with 1 and 8 concurrent clients: what continuous batching (requests joining the
running decode batch between steps) buys.

  python benchmarks/serve_batching.py --json /tmp/serve_batching.json [--checkpoint DIR] [--max-tokens 64]

Starts `python -m jaxagent.serve` in its own process on a free loopback port (the checkpoint given, else a
random VLM exported to a temporary directory: `--size small`, a 4-layer
width-512 decoder, by default, whose decoding costs more than a request's HTTP round trip on a CPU), warms every batch-size
bucket up, then measures generated tokens per second (completion tokens counted by the server) for one
client sending requests back to back, and for 8 clients doing the same at once, against the same model.
The reference is the single client, measured in the same run; the target is a ratio of at least 4x.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


# Decoder overrides of `serving.checkpoint.random_policy` (tiny = its defaults, the IL recipe's shapes).
SIZES = {"tiny": {}, "small": {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4,
                               "head_dim": 64, "intermediate_size": 1408},
         "medium": {"hidden_size": 1024, "num_layers": 4, "num_heads": 16, "num_kv_heads": 8, "head_dim": 64,
                    "intermediate_size": 2816}}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start_server(checkpoint: str, port: int, max_new_tokens: int) -> subprocess.Popen:
  cmd = [sys.executable, "-m", "jaxagent.serve", "--checkpoint", checkpoint, "--port", str(port),
         "--served-model-name", "bench", "--max-batch", "8", "--max-new-tokens", str(max_new_tokens)]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 900
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"server exited: {proc.stdout.read()[-3000:]}")
    try:
      if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
        return proc
    except httpx.HTTPError:
      pass
    time.sleep(1)
  proc.kill()
  raise RuntimeError("server did not come up in 900 s")


def _prompt(i: int) -> list[dict]:
  return [{"role": "system", "content": "You are a web agent. Answer with a Thought and an Action."},
          {"role": "user", "content": f"Task {i:06d}: find the cheapest red kettle on the shop and add it to the cart. "
                                      "Observation: [1] link 'Kitchen' [2] textbox 'Search' [3] button 'Go'"}]


def _client_loop(url: str, n: int, offset: int, max_tokens: int) -> int:
  import openai  # pylint: disable=g-import-not-at-top
  client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
  tokens = 0
  for k in range(n):
    resp = client.chat.completions.create(model="bench", messages=_prompt(offset + k), max_tokens=max_tokens,
                                          temperature=1.0)
    tokens += resp.usage.completion_tokens
  return tokens


def _measure(url: str, clients: int, per_client: int, max_tokens: int) -> dict:
  before = httpx.get(url + "/stats").json()
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as ex:
    tokens = sum(ex.map(lambda c: _client_loop(url, per_client, 1000 * c, max_tokens), range(clients)))
  dt = time.perf_counter() - t0
  after = httpx.get(url + "/stats").json()
  steps = after["steps"] - before["steps"]
  return {"clients": clients, "requests": clients * per_client, "tokens": tokens, "seconds": dt,
          "tokens_per_s": tokens / dt, "decode_steps": steps,
          "mean_batch": (after["active_slot_steps"] - before["active_slot_steps"]) / max(steps, 1),
          "compiled_during": after["distinct_shapes"] - before["distinct_shapes"]}


def _measure_warm(url: str, clients: int, per_client: int, max_tokens: int, tries: int = 4) -> dict:
  """A measurement during which no new program was compiled (a new batch-size bucket compiles once)."""
  for _ in range(tries):
    out = _measure(url, clients, per_client, max_tokens)
    if not out["compiled_during"]:
      return out
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", required=True)
  p.add_argument("--checkpoint", default="", help="policy to serve (default: a random VLM of --size)")
  p.add_argument("--size", choices=sorted(SIZES), default="small",
                 help="random VLM: 'tiny' (the IL recipe's shapes; HTTP overhead dominates on a CPU), 'small', "
                      "'medium' (decoding weight-bound even on a CPU, where batching pays)")
  p.add_argument("--max-tokens", type=int, default=64)
  p.add_argument("--requests-per-client", type=int, default=4)
  args = p.parse_args()

  tmp = tempfile.mkdtemp(prefix="serve_bench_")
  checkpoint = args.checkpoint
  if not checkpoint:
    from jaxagent.serving.checkpoint import export_policy, random_policy  # pylint: disable=g-import-not-at-top
    checkpoint = export_policy(random_policy("vlm", **SIZES[args.size]), os.path.join(tmp, "policy"))
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  proc = _start_server(checkpoint, port, args.max_tokens)
  try:
    # each measurement is repeated until no program was compiled during it (prompts have one length bucket)
    one = _measure_warm(url, 1, args.requests_per_client * 2, args.max_tokens)
    eight = _measure_warm(url, 8, args.requests_per_client, args.max_tokens)
  finally:
    proc.terminate()
    proc.wait(timeout=30)
  ratio = eight["tokens_per_s"] / one["tokens_per_s"]
  result = {"checkpoint": args.checkpoint or f"random {args.size} VLM {SIZES[args.size]}", "max_tokens": args.max_tokens,
            "one_client": one, "eight_clients": eight, "ratio_8_vs_1": ratio, "target_ratio": 4.0}
  print(f"1 client : {one['tokens_per_s']:8.1f} tokens/s ({one['requests']} requests, {one['decode_steps']} "
        f"decode steps)")
  print(f"8 clients: {eight['tokens_per_s']:8.1f} tokens/s ({eight['requests']} requests, {eight['decode_steps']} "
        f"decode steps, mean active slots per step {eight['mean_batch']:.2f})")
  print(f"ratio 8/1: {ratio:.2f}x (target >= 4x)")
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
