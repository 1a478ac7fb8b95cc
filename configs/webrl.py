"""WebRL end to end (`reference/algorithms.md` §3): tasks → SFT → ORM → phases of (curriculum → rollouts →
ORM labels → critic → actor) → evaluation on held-out tasks.

  python -m jaxagent.main --config=configs/webrl.py --workdir=/tmp/webrl

The bare file is the embedded default (a laptop CPU, no download): the bundled sites' desktop window with WebRL's
simplified-HTML observation (`text` profile, no screenshots), the `shop_category_order` tasks (24 (category,
order) pairs in train, 8 held-out pairs in test), a tiny text decoder trained from scratch on the scripted
expert's WebRL-format demonstrations (the stand-in for the SFT Llama-3.1-8B) with a tokenizer fitted on them and
a warm-up on the same samples with short pages first (without it that decoder does not learn to read the
instruction: docs/results/webrl.md#warmup), an ORM and a critic on its trunk, and two phases. Every training
episode (demonstrations, ORM data, curriculum rollouts) is a train task; the evaluation's are the test tasks.
Figures and departures: docs/results/webrl.md.

Keys a researcher changes first:
  phases            how many curriculum → rollouts → critic → actor phases
  curriculum.tasks  new tasks per phase (the original keeps 500)
  actor.loss        code (the code's clipped log-ratio regression, §3.8) | paper ((β log π/π_ref − A)²) | sft
  actor.normalize   sample (actor.loss=code's log-ratio over each sample's tokens, as the code's batch of one per
                    device) | batch (over the whole batch's kept tokens: the figures before this key)
  replay.chunks     the replay keeps each task's first success within each of this many strided chunks of the past
                    episodes (the original's 8 worker chunks: up to 8 a task) | 1 (one a task: the figures before)
  orm.page          full (the ORM reads the last step's whole page, the sample cut by tokens at data.seq_len, as
                    the original) | prompt (the page as the prompt cut it at prompt_chars: the figures before)
  html              full (the observer's simplified HTML) | compact (the original parser's attributes, no data-bbox)
  sft.warmup        steps / prompt_chars: SFT steps on the demonstrations with each page cut to prompt_chars
                    characters before the SFT proper (a departure; 0 steps = off); orm.warmup the same for the ORM (off)
  sft.augment.copies
                    0 | n: n copies of each demonstration with its typed and answered strings made up (a departure,
                    off: a held-out intent's strings must be copied, which a tiny model does not learn from a few
                    hundred demonstrations' strings; docs/results/webrl.md#bench-cut)
  data.tokenizer    demos (the embedded BPE fitted again on the demonstrations' texts: half the tokens) | "" (the
                    embedded BPE, or a checkpoint's own) | a tokenizer directory
  prompt_chars      where the prompt cuts history + HTML (the original's 15872; 2048 keeps the default's
                    category pages up to their sort links, and every sequence under ~2k tokens on a CPU)
  reward            orm (the recipe's reward, as in WebRL) | judge (the programmatic verdict: an oracle ablation)
  early_stop        parse_failures / repeats: end an episode after that many consecutive unparsable replies /
                    identical replies (VAB run.py's rule, 5 and 5 in WebRL's evaluation); 0 turns one off
  curriculum.generator
                    variations (offline: other parameters of the failed task's template, each with its
                    evaluator) | mutations (offline, tasks.suite=bench: the failed task one step along the tier
                    axis, `curriculum.kinds`: a constraint changed, a constraint added, or a family one subgoal
                    above it, each with its evaluator; the bench variant's) | openai (gen_task.py's GPT-4o prompt
                    at `curriculum.openai.base_url`, any OpenAI-compatible endpoint; its tasks have no evaluator,
                    the ORM rewards them; needs reward=orm)
  tasks.suite       sites (the bundled sites' template suites) | bench (the sites benchmark, `docs/benchmark.md`:
                    its train_a / train_b / train_c, the held-out headline as `test`, the negative control as
                    `control`; `tasks.templates` then names benchmark families ("" = all), `tasks.level` the
                    perturbation level (default 2, the headline's), and each family keeps its own step cap instead
                    of `tasks.max_steps`). `demos.split`, `orm.split` and `curriculum.split` choose each stage's
                    tasks (default `train`; the benchmark's roles: train_a, train_b, train_c).

Variants (`configs/webrl.py:<name>`):
  smoke   a handful of episodes and steps per stage: the end-to-end test (`tests/recipes/test_webrl.py`).
  smollm  SmolLM2-135M-Instruct (real pretrained weights, offline) as the policy, ORM and critic trunk; packed rows
          of up to 4,096 tokens under `model.attention=flash` and `model.remat=full`.
  bench   the sites benchmark's text profile (`docs/benchmark.md`), fixed before any run on it: every text family
          at perturbation level 2; demonstrations from train_a, the ORM's episodes from train_b, the curriculum's
          pool train_c, mutated along the tier axis; every headline intent (210) and the negative control's 8
          evaluated once per policy; the original's prompt cut (15872), as its pages outgrow the default's.
          `bench=1` puts another variant on the benchmark the same way, e.g. `configs/webrl.py:smollm,bench=1`.
  base=1  starts from the project's pre-trained base (`model.base=pretrain`, configs/pretrain.py, built once and
          cached): its size and tokenizer, no warm-ups (it reads already), 384 demonstrations and 1,200 SFT steps
          at 5e-4, e.g. `configs/webrl.py:bench,base=1`: 25, 3 and 20 of 210 headline intents at seeds 0-2,
          7.6 % over the three (96 demonstrations and 300 steps: 0 to 3 of 210; docs/results/pretrain.md#three-seeds).
"""

from __future__ import annotations

import ml_collections

from jaxagent import config_lib

VARIANTS = ("smoke", "smollm", "bench")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant="", bench=False, base=False)
  c = config_lib.base_config(staged=True)
  c.recipe = "webrl"
  c.html = "compact"  # full | compact
  c.prompt_chars = 2048  # the prompt's cut of the HTML (the original: 16384 − 512 = 15872)
  c.reward = "orm"  # orm | judge

  c.model = config_lib.vlm_model()
  c.model.kind = "decoder"
  c.data = ml_collections.ConfigDict()
  # demos = the embedded BPE fitted again with the SFT demonstrations' texts (train tasks only) added to its corpus:
  # the sites' HTML in half the tokens, about what Llama-3's tokenizer spends on it; "" = the embedded BPE (or the
  # HF checkpoint's own); a path = that tokenizer
  c.data.tokenizer = "demos"
  c.data.seq_len = 2560  # ≥ the longest prompt + reply, in the embedded tokenizer
  c.data.image_size = 64  # unused by a text decoder; read by the shared model builder
  c.data.max_images = 0
  c.data.num_threads = 2
  # how SFT-style stages batch their samples: auto (several samples a row, `data/packing.py`, where the loss is
  # token-level and the model a text decoder: the SFT, ORM and warm-ups; the actor's per-sample losses pad) |
  # pack (refused where it cannot) | pad (one sample a row, padded to the longest)
  c.data.packing = "auto"

  c.tasks = ml_collections.ConfigDict(dict(seed=0, templates="shop_category_order", max_steps=6, suite="sites",
                                           level=2))
  # VAB run.py's early stop, as WebRL's evaluation ran it: after k consecutive parse failures or identical replies.
  c.early_stop = ml_collections.ConfigDict(dict(parse_failures=5, repeats=5))  # 0 turns a rule off
  c.env = config_lib.env_block(workers=4)
  # No browser: the sites' pages simplified in-process, byte for byte Chromium's prompts and server state
  # (tests/envs/sites/test_text_env.py), ~13x the episodes/s; --config.env.browser=chromium is the reference.
  c.env.browser = "text"
  c.sampling = ml_collections.ConfigDict(dict(max_tokens=64, max_batch=16))
  c.scoring = ml_collections.ConfigDict(dict(batch=4))  # rows per forward pass when scoring samples

  # SFT: the scripted expert's demonstrations in WebRL's format (the original's web_policy_sft).
  c.demos = ml_collections.ConfigDict(dict(episodes=48, split="train"))  # split: train | train_a | train_b | train_c
  c.sft = config_lib.stage(steps=300, batch_size=4, lr=1e-3)
  # a departure: first `steps` steps on the same samples with each page cut to `prompt_chars` characters (the
  # tiny decoder learns to read the instruction there, not on full pages; docs/results/webrl.md#warmup); 0 = off
  c.sft.warmup = ml_collections.ConfigDict(dict(steps=900, prompt_chars=200))
  # a departure, off: `copies` more samples of each demonstration with the strings it types or answers swapped for
  # made-up ones everywhere (data/copy_augment.py), so that only copying them reproduces its replies
  c.sft.augment = ml_collections.ConfigDict(dict(copies=0))

  # ORM: trained on programmatically judged episodes on train tasks: the SFT actor's rollouts, the demonstrations
  # and the expert's near misses (a sibling task's solution under this task's intent, `orm.near_misses`);
  # `val_fraction` of them held out to report its agreement with the judge: `held_out` task (that fraction of the
  # intents, with their demonstrations: texts the ORM never saw) | episode (that fraction of the episodes; a held-out
  # success then repeats its demonstration's text, in train); `split`: the tasks its episodes are drawn from
  c.orm = ml_collections.ConfigDict(dict(episodes=48, temperature=1.0, near_misses=32, val_fraction=0.25,
                                         held_out="task", split="train"))
  c.orm.update(config_lib.stage(steps=150, batch_size=4, lr=1e-3))
  # the same departure as sft.warmup for the ORM, the final page cut; off, as the run's 20 minutes need its time
  # (without it the ORM says YES to every episode at two seeds of three: docs/results/webrl.md#committed)
  c.orm.warmup = ml_collections.ConfigDict(dict(steps=0, prompt_chars=200))
  # the final page it reads: full (rm_format's whole last page; a sample over data.seq_len loses the page's end,
  # as the original keeps a prompt's first tokens) | prompt (as the policy's prompt cut it: shorter sequences)
  c.orm.page = "full"

  c.phases = 2
  # `split`: the pool the variations of failed tasks are drawn from
  c.curriculum = ml_collections.ConfigDict(dict(tasks=48, critic_filter=True, low=0.05, high=0.75, split="train"))
  c.curriculum.generator = "variations"  # variations | mutations | openai
  # generator=mutations: which mutations of a failed benchmark task to draw (comma-separated)
  c.curriculum.kinds = "change,add,subgoal"
  # generator=openai: gen_task.py's requests (per site `turns` of min(`seeds`, |failed|) failed intents), to any
  # OpenAI-compatible endpoint; the key is read from $`api_key_env`.
  c.curriculum.openai = ml_collections.ConfigDict(dict(
      base_url="", model="gpt-4o-2024-05-13", turns=2, seeds=10, api_key_env="OPENAI_API_KEY", max_tokens=4096))
  # `max_lag` L > 0: phase t's curriculum and rollouts run (by π_{t−1−L}) while π_{t−1} trains, once
  # phase t−1's critic exists (pipeline/async_collect.py); 0 = the original's order.
  c.rollout = ml_collections.ConfigDict(dict(temperature=1.0, max_lag=0))
  c.critic = config_lib.stage(steps=200, batch_size=32, lr=1e-3, warmup_steps=0, end_lr_ratio=1.0)
  c.actor = config_lib.stage(steps=100, batch_size=4, lr=3e-4)
  c.actor.loss = "code"  # code | paper | sft
  # at most this many passes over a phase's samples (the original: one epoch); 100 steps × 4 are ~2 over a phase
  # of 48 tasks, and the critic filter can leave 3 (docs/results/webrl.md#epochs)
  c.actor.epochs = 2.0
  c.actor.beta = 0.5  # the paper's β (actor.loss=paper)
  c.actor.add_sft_loss = False  # the code's add_sft_loss term (off in its configs)
  # actor.loss=code's log-ratio normalisation: sample (each sample's action tokens: the code's batch of one per
  # device) | batch (the batch's kept tokens together: a smaller ratio, a larger β, smaller gradients)
  c.actor.normalize = "sample"
  # chunks: the first success of each task is kept within each strided chunk past[i::chunks] (replay_data's 8
  # worker processes: up to 8 a task); 1 = one a task overall
  c.replay = ml_collections.ConfigDict(dict(low=0.5, high=0.95, cap=2, chunks=8))

  # episodes drawn from the test split (0 = each test task once: the benchmark's protocol); with tasks.suite=bench
  # the negative control's intents are evaluated too, each once
  c.eval = ml_collections.ConfigDict(dict(episodes=100, temperature=0.0, seed=1))  # VAB evaluates at T 0

  c.checkpoint.every = 100
  c.checkpoint.async_save = False  # the next stage reloads each checkpoint at once

  if arg.variant == "smoke":
    c.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
    c.tasks.max_steps = 3
    c.env.workers = 2
    c.sampling.max_tokens = 16
    c.demos.episodes = 2
    c.sft.train.update(steps=3, batch_size=2)
    c.sft.warmup.steps = 2
    c.orm.warmup.steps = 2
    c.orm.update(episodes=3, near_misses=2)
    c.orm.train.update(steps=2, batch_size=2)
    c.phases = 2  # phase 2 runs the critic filter
    c.curriculum.tasks = 2
    c.critic.train.update(steps=3, batch_size=4)
    c.actor.train.update(steps=2, batch_size=2)
    c.eval.episodes = 2
    c.train.progress_bar = False
    c.checkpoint.every = 2
  elif arg.variant == "smollm":
    c.model.hf_checkpoint = "smollm2"
    c.data.tokenizer = ""  # the checkpoint's own
    c.data.seq_len = 4096
    # packed rows of up to 4,096 tokens: attention in tiles, each block recomputed in the backward (2 x 4,096
    # tokens, full fine-tuning: 6.5 GiB by the compiled step, docs/results/performance.md#long-context)
    c.model.update(attention="flash", remat="full")
    c.sft.update(config_lib.stage(steps=200, batch_size=2, lr=5e-5))
    c.sft.warmup.steps = c.orm.warmup.steps = 0  # a pretrained model reads already
    c.orm.update(config_lib.stage(steps=100, batch_size=2, lr=5e-5))
    c.actor.update(config_lib.stage(steps=60, batch_size=2, lr=1e-5))
    c.scoring.batch = 1
  elif arg.variant and arg.variant != "bench":
    raise ValueError(f"configs/webrl.py: unknown variant {arg.variant!r}; choose one of {VARIANTS}")
  if arg.variant == "bench" or arg.bench:
    c.tasks.update(suite="bench", templates="", level=2)
    c.demos.split, c.orm.split, c.curriculum.split = "train_a", "train_b", "train_c"
    c.curriculum.generator = "mutations"
    c.eval.episodes = 0
    # the original's cut, which no benchmark page reaches (≤ 5,100 characters): at the default's 2048 the expert's
    # element is out of the prompt on 30 % of its headline steps (docs/results/webrl.md#bench-cut)
    c.prompt_chars = 15872
    c.data.seq_len = 4096  # ≥ the longest such prompt + reply in the embedded tokenizer (3,909)
  if arg.base:
    c.model.base = "pretrain"
    c.sft.warmup.steps = c.orm.warmup.steps = 0  # the base reads already
    # each demonstration seen ~2.4 times: fewer demonstrations, or fewer passes, stay at the floor
    # (docs/results/pretrain.md#more-demos); ~26 min on 2 cores
    c.demos.episodes = 384
    c.sft.update(config_lib.stage(steps=1200, batch_size=4, lr=5e-4))
  return c
