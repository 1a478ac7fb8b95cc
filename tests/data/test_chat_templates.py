"""Checkpoint chat templates (ChatML, Llama-3, LLaVA-1.5) render training samples, their loss spans and the
acting prompt consistently: the prompt a policy sends is the training text up to the assistant's reply."""

import copy
import dataclasses

import numpy as np
import pytest

from jaxagent.data import conversation
from jaxagent.data.tokenizer import IMAGE_TOKEN, load_tokenizer
from jaxagent.serving.checkpoint import random_policy
from jaxagent.serving.engine import Engine

# Transcribed from the checkpoints' tokenizer_config.json / chat_template.json.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")
LLAVA15 = ("{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}"
           "{% endif %}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
           "{{ '<image>\n' }}{% endfor %}{% if message['role'] != 'assistant' %}{% for content in message['content'] "
           "| selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content "
           "in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}"
           "{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}"
           "{% endif %}")
TEMPLATES = {  # template: (what an assistant turn "reply" adds after the prompt that asks for it)
    "chatml": (CHATML, "reply<|im_end|>\n"),
    "llama3": (LLAMA3, "reply<|eot_id|>"),
    "llava15": (LLAVA15, " reply "),  # its generation prompt ends "ASSISTANT:", the reply brings the space
}
SAMPLE = {"id": "s", "images": ["a.png", "b.png"], "conversations": [
    {"from": "human", "value": f"{IMAGE_TOKEN}\nGoal: open the shop"},
    {"from": "gpt", "value": "reply"},
    {"from": "human", "value": f"{IMAGE_TOKEN}\nnext"},
    {"from": "gpt", "value": "reply"},
]}


def _tokenizer(template):
  tok = copy.deepcopy(load_tokenizer())
  tok.chat_template = template
  return tok


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_spans_are_each_reply_and_its_closing_marker(name):
  template, reply = TEMPLATES[name]
  tok = _tokenizer(template)
  text, spans = conversation.render_chat(SAMPLE["conversations"], tok)
  assert [text[s:e] for s, e in spans] == [reply, reply]
  assert text.count(IMAGE_TOKEN) == 2  # both placeholders survive, whichever content form the template reads
  # the acting prompt for the second reply is the training text up to it
  assert conversation.generation_prompt(SAMPLE["conversations"][:3], tok) == text[:spans[1][0]]
  engine = Engine(dataclasses.replace(random_policy("decoder", num_layers=1, hidden_size=64, head_dim=16,
                                                   intermediate_size=128), tokenizer=tok))
  assert engine.training_prompt(SAMPLE["conversations"][:1]) == text[:spans[0][0]]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_loss_mask_covers_the_replies_only(name):
  template, reply = TEMPLATES[name]
  tok = _tokenizer(template)
  ids, loss = conversation.tokenize(SAMPLE, tok, num_image_tokens=3)
  image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
  assert int(np.sum(ids == image_id)) == 6 and not np.any(loss[ids == image_id])
  assert tok.decode(ids[loss.astype(bool)].tolist()).replace(" ", "") == (2 * reply).replace(" ", "")


def test_llama3_bos_is_written_once():
  tok = _tokenizer(LLAMA3)
  text, _ = conversation.render_chat(SAMPLE["conversations"], tok)
  assert text.startswith(tok.bos_token + "<|start_header_id|>user") and text.count(tok.bos_token) == 1


def test_our_template_is_rendered_by_hand():
  tok = load_tokenizer()
  assert conversation.own_template(tok)
  assert conversation.render_chat(SAMPLE["conversations"], tok) == conversation.render(SAMPLE["conversations"],
                                                                                       tok.bos_token)


def test_a_template_that_rewrites_earlier_turns_is_refused():
  tok = _tokenizer("{{ messages | length }}{% for m in messages %}|{{ m['content'] }}{% endfor %}")
  with pytest.raises(conversation.ConversationError, match="assistant turn 1"):
    conversation.render_chat(SAMPLE["conversations"], tok)
