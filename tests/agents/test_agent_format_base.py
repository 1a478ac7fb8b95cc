"""The agent-format registry and the chat-message helpers."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from jaxagent.agents import base
from jaxagent.agents import format_names, get_format, to_openai_messages


def test_registry_names_and_errors():
  assert format_names() == ["autoui", "autoui_text", "openwebvoyager", "openwebvoyager_compact", "webrl", "webvoyager",
                            "webvoyager_actree_image", "webvoyager_text"]
  with pytest.raises(KeyError, match="unknown agent format 'nope'; known formats are"):
    get_format("nope")
  with pytest.raises(ValueError, match="registered twice"):
    base.register("webrl")(lambda: None)


def test_openai_messages_encode_arrays_and_paths(tmp_path):
  img = np.random.default_rng(0).integers(0, 255, (5, 7, 3), dtype=np.uint8)
  (tmp_path / "s0.png").write_bytes(base.png_bytes(img[::-1]))
  msgs = [{"role": "system", "content": "sys"},
          {"role": "user", "content": [base.text_part("hi"), base.image_part(img), base.image_part("s0.png")]}]
  out = to_openai_messages(msgs, image_root=str(tmp_path))
  assert out[0] == {"role": "system", "content": "sys"}
  assert out[1]["content"][0] == {"type": "text", "text": "hi"}
  decoded = []
  for part in out[1]["content"][1:]:
    url = part["image_url"]["url"]
    assert part["type"] == "image_url" and url.startswith("data:image/png;base64,")
    decoded.append(np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))))
  np.testing.assert_array_equal(decoded[0], img)
  np.testing.assert_array_equal(decoded[1], img[::-1])
  assert base.count_images(msgs) == 2
  with pytest.raises(ValueError, match=r"screenshot must be uint8 \[H, W, 3\|4\]"):
    base.png_bytes(np.zeros((2, 2), np.float32))
