"""`train.memory.step_memory`: a config's train step sized by compile alone. With `attention=flash` and remat, a
SmolLM2-shaped LoRA step's temporaries grow linearly with the sequence length, not with its square."""

import pytest

from configs import il as il_config
from jaxagent.data.tokenizer import load_tokenizer
from jaxagent.train.memory import step_memory

# SmolLM2-135M's layer (hidden 576, 9 query / 3 key-value heads of 64, MLP 1536), two of them, and the embedded
# tokenizer's small vocabulary, so that attention's share of the step shows instead of the logits'
SMOLLM2_LAYER = dict(hidden_size=576, num_layers=2, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536)


def _config(seq_len: int, attention: str, remat: str):
  config = il_config.get_config("text")
  config.model.update(kind="decoder", attention=attention, remat=remat)
  config.model.decoder.update(SMOLLM2_LAYER)
  config.model.lora.rank = 8
  config.data.seq_len = seq_len
  return config


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer(None)


@pytest.mark.slow
def test_a_flash_lora_step_grows_linearly_with_the_sequence(tokenizer):
  temp = {t: step_memory(_config(t, "flash", "full"), tokenizer, 2, t)["temp"] for t in (1024, 8192)}
  assert temp[8192] / temp[1024] < 8 * 1.1, temp  # 8x the tokens, 8x the bytes (the plain kernel: T^2)


@pytest.mark.slow
def test_remat_lowers_the_compiled_temp_bytes(tokenizer):
  temp = {r: step_memory(_config(2048, "flash", r), tokenizer, 2, 2048)["temp"] for r in ("none", "full")}
  assert temp["full"] < 0.7 * temp["none"], temp
