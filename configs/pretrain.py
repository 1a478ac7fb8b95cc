"""Pre-training the project's small base on grounding and copying (`jaxagent/recipes/pretrain.py`).

  python -m jaxagent.main --config=configs/pretrain.py --workdir=/tmp/pretrain

The bare file is the base every recipe's `--config.model.base=pretrain` builds once and caches: a Llama-family
decoder trained from scratch on skill queries (click / type / search / read / say) over pages of worlds
`corpus.worlds`, probed on worlds `probes.worlds`; both ranges lie above every evaluation world (the global seeds
0, 1, 2, ... are the benchmark's worlds). Sizes, corpus and steps are chosen on the probes (held-out worlds), never on
a benchmark figure. As committed, its base finds the element a query names 70 % of the time on the held-out probes
(a click by name 56 %), copies a string 38 % (40-48 % when typing, searching or answering) and reads a value 5 %, in
33 minutes (docs/results/pretrain.md#spans); an earlier commit's copied 80-84 % and looked up 12 % (#targets).
Every reply opens with the scripted expert's note (`# Note: I will click "X".`), as the demonstrations do.

Keys a researcher changes first:
  model.decoder     the base's size (hidden_size, num_layers, heads, intermediate_size)
  warmup.train      steps, batch_size on windows of corpus.window_chars characters of the pages (windows_per_page
                    a page), packed rows of warmup.seq_len tokens; 0 steps = none
  pretrain.train    steps, batch_size on the whole pages (packed rows of data.seq_len tokens), from the warm-up
  corpus.worlds     first / count: the pre-training worlds; corpus.walks_per_world × walk_steps pages a world,
                    one conversation a page: a query in WebRL's prompt, then follow-up queries on the same page
                    up to about corpus.sample_chars characters (~ data.seq_len tokens)
  corpus.skills     which skills the corpus holds (comma-separated, of `proj.pretrain.corpus.SKILLS`), drawn
                    uniformly from the list (a skill named twice is drawn twice as often; the probes ask each
                    skill alike); `mention` (click the one element a sentence names that the page shows and no
                    earlier round clicked) is left out: in the same budget it cost the look-up and the copy more
                    than it gave (docs/results/pretrain.md#mention)
  corpus.format     the agent formats the corpus is written in (comma-separated, of `corpus.FORMATS`; the walks
                    shared among them as they are repeated): webrl (WebRL's prompt over the text profile's pages),
                    autoui_text (the phone's screen as text, AutoUI's prompt and decisions over the phone profile's
                    pages cut at corpus.page_chars, as DigiRL's `env.observation=html` reads them)
  corpus.quotes     how queries quote a name or a string (of `corpus.QUOTES`: straight "X", curly “X”, bare X for
                    a name), drawn uniformly; the probes ask in the same styles and report each
  loss_on           reply (the loss on the replies only: the skills) | all (every token, pages included)
  targets           the attention targets (a named departure, `proj.pretrain.targets`): weight 0 = a plain LM;
                    previous_heads: heads of layer 0 that read the token before each (for copying)
  model.decoder.copy_head   a pointer over the prompt's tokens mixed into the output (its width; 0 = none): at 32 it
                    copies in order but runs past a string's end, less with its gate's target (targets.gate), and
                    costs the look-up more than it gives the copy (docs/results/pretrain.md#gate)
  data.vocab_size   the BPE fitted on the corpus

Variants (`configs/pretrain.py:<name>`, a recipe's `--config.model.base=pretrain:<name>`):
  phone   the corpus in the phone's text format alone (corpus.format=autoui_text; at this budget a corpus in both
          formats halves each one's steps and loses most of the look-up and the copy in both,
          docs/results/pretrain.md#phone-format): it taps an element by name 62 % of the time on held-out worlds
          but copies ~1 %, and its IL start sits at the floor (#phone-base)
  smoke   a few worlds, pages and steps: the end-to-end test (`tests/recipes/test_pretrain.py`).
"""

from __future__ import annotations

import ml_collections

from jaxagent import config_lib

VARIANTS = ("smoke", "phone")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant="")
  c = config_lib.base_config(staged=True)
  c.recipe = "pretrain"
  c.loss_on = "reply"  # reply | all

  c.model = config_lib.vlm_model()
  c.model.kind = "decoder"
  c.model.decoder.update(hidden_size=192, num_layers=3, num_heads=6, num_kv_heads=3, head_dim=32,
                         intermediate_size=576, max_position_embeddings=4096,  # the recipes' longest prompts
                         tie_word_embeddings=True)  # a head that copies a token writes its own unembedding
  # The attention targets (`proj.pretrain.targets`, a named departure: docs/results/pretrain.md#targets): the loss
  # also asks reply_heads heads of layer reply_layer to attend to where a reply's content comes from,
  # link_heads heads of layer 0 to attend from an element's words to its id (and from its values to its name),
  # name_heads heads of layer name_layer to bring the name an instruction quotes to the reply that looks it up;
  # previous_heads heads of layer 0 (past the link heads' keys) to attend from each token to the one before it (what
  # a copy needs to move on to the next token); readout: those heads' output alone names the token they attend to
  # (the previous heads' at every previous_readout_every-th token, for the budget: docs/results/pretrain.md#readout);
  # span_heads heads of layer 0 (past those) to attend evenly over a name's tokens at its last (a name's summary,
  # where sibling products share the last token); copy_init sets the reply, link and name heads' value and output
  # projections to copy (0 = the usual random init). weight 0: a plain
  # causal LM on the replies.
  c.targets = ml_collections.ConfigDict(dict(weight=1.0, reply_layer=-1, reply_heads=3, link_heads=1,
                                             name_layer=1, name_heads=1, previous_heads=1, readout=True,
                                             previous_readout_every=8, span_heads=1, copy_init=1.0, pointer=1.0,
                                             gate=1.0))
  # A copy head (`models.llama.CopyHead`, item 4 of issue 56, a named departure: docs/results/pretrain.md#copy-head):
  # a pointer over the prompt's tokens of this query/key width, mixed into the output by a gate, 0 = none;
  # targets.pointer weighs its pointer's target (the source of a reply token that holds that token), targets.gate
  # its gate's (the pointer at those tokens, the vocabulary at the reply's other tokens: where a copy ends).
  c.model.decoder.update(copy_head=0, copy_top_k=32)
  c.data = ml_collections.ConfigDict(dict(vocab_size=4096, seq_len=1536, num_threads=2))
  c.data.image_size = 64  # unused by a text decoder; read by the shared model builder
  c.data.max_images = 0

  c.corpus = ml_collections.ConfigDict(dict(format="webrl", skills="click,click,type,search,read,read,say",
                                            walks_per_world=20,
                                            walk_steps=8, sample_chars=3500, prompt_chars=15872,
                                            window_chars=700, windows_per_page=3,
                                            window_sample_chars=1200, quotes="straight,curly,bare",
                                            page_chars=2048))  # the phone's page cut (DigiRL's data.page_chars)
  c.corpus.worlds = ml_collections.ConfigDict(dict(first=1000, count=40))
  c.probes = ml_collections.ConfigDict(dict(walks_per_world=20, examples=400, batch=16, max_tokens=96))
  c.probes.worlds = ml_collections.ConfigDict(dict(first=5000, count=5))

  # the warm-up on windows of the pages in short rows, then the whole pages from its weights
  c.warmup = config_lib.stage(steps=600, batch_size=16, lr=2e-3, warmup_steps=50)
  c.warmup.seq_len = 640  # ≥ a window's conversation (corpus.window_sample_chars) in tokens
  c.pretrain = config_lib.stage(steps=250, batch_size=4, lr=1e-3, warmup_steps=30)
  c.checkpoint.every = 100
  c.checkpoint.async_save = False

  if arg.variant == "phone":
    c.corpus.format = "autoui_text"  # the phone's base: DigiRL's screen as text (docs/results/pretrain.md#phone-base)
  elif arg.variant == "smoke":
    c.model.decoder.update(hidden_size=96, num_layers=3, num_heads=6, num_kv_heads=3, head_dim=16,
                           intermediate_size=128)  # layer 0 holds the link, previous and span heads' key groups
    c.data.update(vocab_size=1024, seq_len=1024)
    c.corpus.update(walks_per_world=3, walk_steps=3, prompt_chars=1200, sample_chars=2000)
    c.corpus.worlds.count = 2
    c.probes.update(walks_per_world=2, examples=8, max_tokens=48)
    c.probes.worlds.count = 1
    c.pretrain.train.update(steps=3, batch_size=2)
    c.warmup.train.update(steps=2, batch_size=2)
    c.warmup.seq_len = 1024
    c.corpus.window_chars = 400
    c.train.progress_bar = False
    c.checkpoint.every = 2
  elif arg.variant:
    raise ValueError(f"configs/pretrain.py: unknown variant {arg.variant!r}; choose one of {VARIANTS}")
  return c
