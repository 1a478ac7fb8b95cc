"""OWV conversations: chat rendering, the assistant-only loss mask, image placeholders, the Grain pipeline."""

import json

import numpy as np
import pytest

from jaxagent.data import conversation, pipeline, synthetic_conversations
from jaxagent.data.tokenizer import END_OF_UTTERANCE, IMAGE_TOKEN, load_tokenizer

ITEM = {
    "id": "task1--r00--step02",
    "images": ["a.png", "b.png"],
    "conversations": [
        {"from": "human", "value": "Find the kettle.\nOBSERVATION: <image> (accessibility tree omitted)."},
        {"from": "gpt", "value": "Thought: search it.\n\nAction: Type [5]; kettle"},
        {"from": "human", "value": "OBSERVATION:\n<image>\n[0] RootWebArea 'Shop'\n\t[1] link 'Red kettle'"},
        {"from": "gpt", "value": "Thought: open it.\n\nAction: Click [1]"},
    ],
}


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def test_render_matches_the_tokenizers_chat_template(tok):
  text, _ = conversation.render(ITEM["conversations"], tok.bos_token)
  assert text == tok.apply_chat_template(conversation.to_messages(ITEM["conversations"]), tokenize=False)


def test_only_assistant_turns_carry_loss(tok):
  ids, loss = conversation.tokenize(ITEM, tok, num_image_tokens=4)
  carried = tok.decode(ids[loss.astype(bool)].tolist())
  expected = "".join(f" {t['value']}{END_OF_UTTERANCE}" for t in ITEM["conversations"] if t["from"] == "gpt")
  assert carried == expected
  not_carried = tok.decode(ids[~loss.astype(bool)].tolist())
  assert "Find the kettle" in not_carried and "Thought" not in not_carried


def test_image_placeholders_expand_and_never_carry_loss(tok):
  image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
  ids, loss = conversation.tokenize(ITEM, tok, num_image_tokens=5)
  assert (ids == image_id).sum() == 2 * 5
  assert not loss[ids == image_id].any()
  out, n_images = conversation.encode(ITEM, tok, seq_len=256, num_image_tokens=5)
  assert n_images == 2
  n = out["attention_mask"].sum()
  np.testing.assert_array_equal(out["targets"][:n - 1], out["input_ids"][1:n])  # shifted by one
  assert out["loss_mask"][n:].sum() == 0 and (out["input_ids"][n:] == tok.pad_token_id).all()


def test_truncation_drops_a_cut_image_block_whole(tok):
  image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
  ids, _ = conversation.tokenize(ITEM, tok, num_image_tokens=8)
  second_block = np.flatnonzero(ids == image_id)[8]
  out, n_images = conversation.encode(ITEM, tok, seq_len=int(second_block) + 3, num_image_tokens=8)
  assert n_images == 1
  assert (out["input_ids"] == image_id).sum() == 8  # one complete block, none of the cut one


def test_image_count_mismatch_is_rejected_with_the_id(tmp_path):
  bad = dict(ITEM, id="bad--r01--step03", images=["only_one.png"])
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps(ITEM) + "\n" + json.dumps(bad) + "\n")
  with pytest.raises(conversation.ConversationError, match=r"bad--r01--step03.*2 <image> placeholder.*1 entries"):
    conversation.load_conversations(str(path))


def test_malformed_turn_names_the_field():
  with pytest.raises(conversation.ConversationError, match="turn 0 must be"):
    conversation.validate({"id": "x", "images": [], "conversations": [{"from": "system", "value": "hi"}]})


def test_pipeline_batches_images_and_resumes_at_the_same_batch(tmp_path, tok):
  path = synthetic_conversations.generate(str(tmp_path), num_episodes=3, seed=1, image_size=(80, 60))
  items = conversation.load_conversations(path)
  assert all(len(it["images"]) <= 3 for it in items)
  from jaxagent.models.vit import ImagePreprocessing
  encode = pipeline.EncodeSample(tok, seq_len=320, num_image_tokens=4, preprocess=ImagePreprocessing.clip(16),
                                 image_size=16, max_images=3)
  ds = pipeline.il_dataset(items, encode, batch_size=2, seed=0)
  it = iter(ds.to_iter_dataset(pipeline.read_options(1)))
  first = next(it)
  assert first["images"].shape == (2, 3, 16, 16, 3) and first["input_ids"].shape == (2, 320)
  image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
  np.testing.assert_array_equal((first["input_ids"] == image_id).sum(1), 4 * first["image_mask"].sum(1))
  state = it.get_state()
  expected = next(it)
  again = iter(ds.to_iter_dataset(pipeline.read_options(1)))
  again.set_state(state)
  resumed = next(again)
  for k in expected:
    np.testing.assert_array_equal(resumed[k], expected[k])
