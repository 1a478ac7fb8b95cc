"""Tokenizers: the embedded default's byte-level BPE, built here with no download, and checkpoint tokenizers.

Both are Hugging Face fast tokenizers loaded with `transformers.AutoTokenizer.from_pretrained(dir)`. The default
is trained on a generated corpus of agent prompts and actions (`synthetic_conversations.corpus()`), saved in HF
format (`tokenizer.json`, `tokenizer_config.json` with the chat template) and cached, so every process and
every run gets the same ids. Byte-level, so any text encodes.

Special tokens follow idefics2 (OpenWebVoyager's policy, `reference/algorithms.md` §2.1): `<image>` placeholders
in the text and `<end_of_utterance>` closing every turn.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from jaxagent.tokens import IMAGE_TOKEN  # a leaf, so that models/ can share it

END_OF_UTTERANCE = "<end_of_utterance>"
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, IMAGE_TOKEN, END_OF_UTTERANCE)

# idefics2-style turns: "User: ...<end_of_utterance>\nAssistant: ...<end_of_utterance>\n"; generation starts
# after "Assistant:". Content may be a string (with inline <image>) or a list of {"type": "text"|"image"}.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %}{{ ' ' + message['content'] }}"
    "{% else %}{% for chunk in message['content'] %}"
    "{% if chunk['type'] == 'image' %}<image>{% else %}{{ ' ' + chunk['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}")

# Image tokens a checkpoint's chat template writes itself for an image part (Qwen2-VL, Qwen2.5-VL).
TEMPLATE_IMAGE_TOKENS = ("<|image_pad|>",)

DEFAULT_VOCAB_SIZE = 1024
_VERSION = "bpe-v1"


# GPT-2's split, with an element's opening (`<a id="`, `<li>`) and closing tag (` </a>`) kept whole: the sites'
# simplified HTML in ~25 % fewer tokens (3.5 characters a token against 2.7 at 4,096 entries), each element's id
# one or two tokens right after its tag, and values split as everywhere else, so a copied string is the same
# tokens on the page, in the instruction and in the reply.
# WebRL's turn markers (Llama-3's, one token each there): one token each here too, not ~20 pieces of punctuation.
HTML_FORMAT_TOKENS = ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")
HTML_SPLIT = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?</?[a-z][a-z0-9]*(?: id="|>)?| ?\p{L}+| ?\p{N}+|">| ?[^\s\p{L}\p{N}]+"""
              r"""|\s+(?!\S)|\s+""")


def train_default_tokenizer(out_dir: str, vocab_size: int = DEFAULT_VOCAB_SIZE, corpus=None,
                            html: bool = False) -> str:
  """Trains the byte-level BPE on the agent corpus and writes it to `out_dir` in HF format (`html`: with the
  `HTML_SPLIT` pre-tokenizer, for models that read the sites' simplified HTML)."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top

  if corpus is None:
    from jaxagent.data import synthetic_conversations  # pylint: disable=g-import-not-at-top
    corpus = synthetic_conversations.corpus()
  tok = Tokenizer(models.BPE(unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  if html:
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(HTML_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(corpus, trainer=trainer)
  if html:
    tok.add_tokens([AddedToken(t, normalized=False) for t in HTML_FORMAT_TOKENS])
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
      additional_special_tokens=[IMAGE_TOKEN, END_OF_UTTERANCE], chat_template=CHAT_TEMPLATE,
      model_max_length=1 << 20, padding_side="right")
  fast.save_pretrained(out_dir)
  return out_dir


def _train_once(path: str, vocab_size: int, corpus=None, html: bool = False) -> str:
  """`train_default_tokenizer` into `path` unless a tokenizer is there; built aside and renamed in one step, so
  concurrent builders (processes of one run) agree on one directory."""
  if not os.path.exists(os.path.join(path, "tokenizer.json")):
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tokenizer-")
    train_default_tokenizer(tmp, vocab_size, corpus, html)
    try:
      os.rename(tmp, path)
    except OSError:
      shutil.rmtree(tmp, ignore_errors=True)
  return path


def fit_tokenizer(out_dir: str, texts, vocab_size: int = 2 * DEFAULT_VOCAB_SIZE, html: bool = False) -> str:
  """The embedded BPE trained again with `texts` (a recipe's training texts) added to its corpus, in HF format in
  `out_dir`: a domain's pages then take about as many tokens as a large model's tokenizer writes them in (half
  the embedded one's on the bundled sites' HTML). Deterministic in `texts`; kept if already there."""
  from jaxagent.data import synthetic_conversations  # pylint: disable=g-import-not-at-top
  return _train_once(out_dir, vocab_size, list(synthetic_conversations.corpus()) + list(texts), html)


def cache_dir() -> str:
  """Where built artefacts (tokenizers, the pre-trained base) are cached: `$JAXAGENT_CACHE` or ~/.cache/jaxagent."""
  return os.environ.get("JAXAGENT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jaxagent"))


def default_tokenizer_dir(vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
  """The cached default tokenizer's directory (built on first use; `$JAXAGENT_CACHE` or ~/.cache/jaxagent)."""
  cache = cache_dir()
  key = hashlib.sha1(f"{_VERSION}-{vocab_size}".encode()).hexdigest()[:10]
  return _train_once(os.path.join(cache, f"tokenizer-{key}"), vocab_size)


def load_tokenizer(path: str | None = None, *, require_image_token: bool = True):
  """A checkpoint directory's tokenizer, or (path None/"default") the embedded default's.

  `path` may also be `smollm2` or a `.gguf` file (`models.hf.gguf.checkpoint_dir`). A VLM's tokenizer must
  have the `<image>` token; a text decoder's (`require_image_token=False`) need not.
  """
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  from jaxagent.models.hf import gguf  # pylint: disable=g-import-not-at-top
  if path in (None, "", "default"):
    path = default_tokenizer_dir()
  if path == "demos":
    raise ValueError("tokenizer 'demos' is fitted by the recipe that names it (configs/webrl.py) before its first "
                     "training; this recipe has none: set --config.data.tokenizer='' or a tokenizer directory")
  tok = AutoTokenizer.from_pretrained(gguf.checkpoint_dir(path))
  missing = [t for t in (IMAGE_TOKEN,) if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
  if missing and require_image_token and not template_image_token(tok):  # Qwen2-VL writes its own
    raise ValueError(f"tokenizer at {path} has no {missing} token; the IL pipeline needs it for image "
                     "placeholders (add it as a special token)")
  if tok.chat_template is None:
    tok.chat_template = CHAT_TEMPLATE
  return tok


def own_template(tokenizer) -> bool:
  """Whether `tokenizer` uses our idefics2-style template (`conversation.render` writes it) rather than its own."""
  return tokenizer.chat_template in (None, CHAT_TEMPLATE)


def _has_token(tokenizer, token: str) -> bool:
  return tokenizer.convert_tokens_to_ids(token) not in (None, tokenizer.unk_token_id)


def template_image_token(tokenizer) -> str | None:
  """The image token a checkpoint's chat template writes for an image part, for a tokenizer without `<image>`
  (Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>`); None otherwise. Samples' `<image>` markers are
  then rendered as image parts, and each such token expands to the image's tokens."""
  if own_template(tokenizer) or _has_token(tokenizer, IMAGE_TOKEN):
    return None
  try:
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False,
                                         add_generation_prompt=False)
  except Exception:  # pylint: disable=broad-except  # a text template that cannot iterate parts
    return None
  return next((t for t in TEMPLATE_IMAGE_TOKENS if t in text and _has_token(tokenizer, t)), None)
