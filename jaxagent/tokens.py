"""Special-token strings shared across layers: a leaf, so `models/` (below `data/`) needs no import of `data/`.

`<image>` is where an image sits in a conversation turn; `data.tokenizer` makes it a special token of the embedded
tokenizer (and re-exports it), the tokenising step expands it to image tokens, and `models.build` gives a tiny
VLM its id as `image_token_id`.
"""

IMAGE_TOKEN = "<image>"
