"""The embedded default tokenizer: built here, loads through transformers.AutoTokenizer, byte-level."""

import os

import pytest
import transformers

from jaxagent.data import tokenizer as tokenizer_lib


def test_default_loads_with_autotokenizer_and_has_special_tokens():
  path = tokenizer_lib.default_tokenizer_dir()
  assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(path))
  tok = transformers.AutoTokenizer.from_pretrained(path)
  ids = [tok.convert_tokens_to_ids(t) for t in tokenizer_lib.SPECIAL_TOKENS]
  assert len(set(ids)) == len(ids) and tok.unk_token_id not in ids[:3] + ids[4:]
  enc = tok("a <image> b<end_of_utterance>", add_special_tokens=False)["input_ids"]
  assert tok.convert_tokens_to_ids("<image>") in enc and tok.convert_tokens_to_ids("<end_of_utterance>") in enc
  assert tok.pad_token == "<pad>" and tok.bos_token == "<s>" and tok.eos_token == "</s>"


def test_byte_level_round_trip_of_unseen_text():
  tok = tokenizer_lib.load_tokenizer()
  text = "Scroll [WINDOW]; down — naïve 价格 €12.50 \t\n"
  assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
  # Agent text is compact: the BPE learnt the action grammar.
  assert len(tok("Action: Click [12]", add_special_tokens=False)["input_ids"]) <= 8


def test_chat_template_generation_prompt():
  tok = tokenizer_lib.load_tokenizer()
  prompt = tok.apply_chat_template([{"role": "user", "content": "hi <image>"}], tokenize=False,
                                   add_generation_prompt=True)
  assert prompt == "<s>User: hi <image><end_of_utterance>\nAssistant:"


def test_saved_copy_loads_the_same(tmp_path):
  tok = tokenizer_lib.load_tokenizer()
  tok.save_pretrained(tmp_path)
  copy = tokenizer_lib.load_tokenizer(str(tmp_path))
  text = "What is the price of the red kettle on ShopLocal?"
  assert copy(text)["input_ids"] == tok(text)["input_ids"]


def test_a_tokenizer_without_image_token_is_rejected(tmp_path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  raw = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
  raw.pre_tokenizer = pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="no \\['<image>'\\] token"):
    tokenizer_lib.load_tokenizer(str(tmp_path))


def test_a_fitted_tokenizer_writes_its_domain_in_fewer_tokens_and_is_reproducible(tmp_path):
  page = ("<html> <body> <nav> " + " ".join(f'<a id="{i}"> {c} </a>' for i, c in
          enumerate(["Apparel", "Audio", "Fitness", "Home", "Kitchen", "Lighting", "Office", "Outdoor"], 5))
          + " </nav> <footer> offline web · shop </footer> </body> </html>")
  texts = [page.replace("Apparel", f"Apparel{k}") for k in range(50)]
  default = tokenizer_lib.load_tokenizer()
  a = tokenizer_lib.load_tokenizer(tokenizer_lib.fit_tokenizer(str(tmp_path / "a"), texts))
  b = tokenizer_lib.load_tokenizer(tokenizer_lib.fit_tokenizer(str(tmp_path / "b"), texts))
  ids = a(page, add_special_tokens=False)["input_ids"]
  assert len(ids) < 0.7 * len(default(page, add_special_tokens=False)["input_ids"])
  assert ids == b(page, add_special_tokens=False)["input_ids"]  # every process fits the same vocabulary
  assert a.decode(ids) == page
  assert a.convert_tokens_to_ids("<image>") != a.unk_token_id and a.chat_template == default.chat_template
