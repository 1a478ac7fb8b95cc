"""DigiRL end to end (`reference/algorithms.md` §4): tasks → demos → IL actor → offline data → critics → Filtered BC
and DigiRL offline actors → online iterations (off2on) → evaluation on held-out tasks.

  python -m jaxagent.main --config=configs/digirl.py --workdir=/tmp/digirl

The bare file is the embedded default (a laptop CPU, no download): the phone-profile `shop_category_sort` tasks
of the bundled sites (16 (category, sort) pairs in train, 8 held-out pairs in test), a tiny VLM trained from
scratch on the scripted expert's demonstrations of the train pairs (the stand-in for AutoUI's SFT checkpoint),
offline data = that actor's own judged rollouts on the train pairs (as DigiRL's released data are AutoUI's), and
`mode=off2on`. Every training episode (demos, offline, online) is a train pair; the evaluation's episodes are the
test pairs, which no stage trains on. Figures and the CPU departures: docs/results/digirl.md.

Keys a researcher changes first:
  mode       offline | off2on | online (the code's `train_mode`)
  algorithm  digirl | filtered_bc: what the online phase trains (`configs/filtered_bc.py` sets filtered_bc); the
             offline Filtered BC actor is always trained as the baseline when there are offline data
  data.path  a TrajectoryStore to train on offline instead of collecting (`data_tools/import_seed_trajectories.py`
             turns the seeds' released `.pt` files into one)
  judge.kind programmatic | llm (DigiRL's per-step evaluator prompt against any OpenAI-compatible endpoint)
  parse      faithful (a decision the original cannot unpack ends the episode) | lenient (it is a no-op)
  model.kind vlm | autoui (the original's encoder-decoder actor: T5 over a frozen image encoder's pooled feature)
             | decoder (a text decoder, with env.observation=html)
  env.observation  screenshot (the faithful default, and `:paper`'s) | html: the phone's screen as WebRL's compact
             simplified HTML, for a text decoder (a tiny one, `model.hf_checkpoint` or `model.base=pretrain`), since a
             64-px screenshot's text is about a pixel tall; with env.browser=text it is served without a browser. The
             prompt and actions stay AutoUI's, a tap naming the page's element (`agents/autoui_text.py`); the critics
             read the page in the prompt's bag of words. `data.page_chars` cuts the page. Digi-Q refuses it.
             `configs/digirl.py:text=1` (or `:smoke,text=1`) sets it with env.browser=text, model.kind=decoder and
             a data.seq_len that fits the page (docs/results/digirl.md#text-observation)
  capacity   the code's replay buffer size (2000, a FIFO over transitions): the step critic's replay and each
             actor's filtered buffer hold the newest `capacity` transitions of their trajectories in the order
             they came (offline, then each online round); 0 = unbounded, every transition (the cap's ablation)
  tasks.suite  sites (the bundled sites' template suites) | bench (the sites benchmark, `docs/benchmark.md`: its
             train_a / train_b / train_c, the held-out headline as `test`, the negative control as `control`;
             `tasks.templates` then names benchmark families ("" = all), `tasks.level` the perturbation level
             (default 2, the headline's), and each family keeps its own step cap instead of `tasks.max_steps`).
             `demos.split`, `offline.split` and `online.split` choose each stage's tasks (default `train`; the
             benchmark's roles: train_a, train_b, train_c)

Variants (`configs/digirl.py:<name>`):
  smoke  a handful of episodes and steps per stage: the end-to-end test (`tests/recipes/test_digirl.py`).
  paper  DigiRL's hyper-parameters (§4.10) at the sites' scale: every device family, 1552 offline episodes,
         400 online iterations of 16 episodes, an AutoUI-size actor from a local HF directory (required:
         `--config.model.hf_checkpoint=DIR`); needs accelerators.
"""

from __future__ import annotations

import ml_collections

from jaxagent import config_lib

VARIANTS = ("smoke", "paper")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant="", text=False)
  c = config_lib.base_config(staged=True)
  c.recipe = "digirl"
  c.mode = "off2on"  # offline | off2on | online
  c.algorithm = "digirl"  # digirl | filtered_bc
  c.parse = "faithful"  # faithful (the originals) | lenient

  c.model = config_lib.vlm_model()
  c.data = ml_collections.ConfigDict()
  c.data.path = ""  # "" = collect the offline data with the IL actor; else a TrajectoryStore directory
  c.data.tokenizer = ""  # "" = the embedded byte-level BPE (or the HF checkpoint's own)
  c.data.seq_len = 384
  c.data.image_size = 64
  c.data.max_images = 1  # AutoUI sees the current screen only
  c.data.num_threads = 2
  c.data.page_chars = 2048  # env.observation=html: the prompt's cut of the page (WebRL's prompt_chars)

  c.tasks = ml_collections.ConfigDict(dict(seed=0, templates="shop_category_sort", max_steps=8, suite="sites",
                                           level=2))
  c.env = config_lib.env_block(workers=2)
  c.env.observation = "screenshot"  # screenshot (AutoUI's, the faithful default) | html (the screen as text)
  c.judge = ml_collections.ConfigDict()
  c.judge.kind = "programmatic"  # programmatic | llm
  c.judge.llm = ml_collections.ConfigDict(dict(protocol="digirl", base_url="", model="gpt-4o",
                                               digirl_task_set="general"))
  c.sampling = ml_collections.ConfigDict(dict(max_tokens=160, max_batch=32))
  c.gamma = 0.5  # MC return discount (the code's `gamma`)
  c.capacity = 2000  # transitions in each replay buffer (the code's `capacity`); 0 = unbounded

  # split: the tasks each stage draws from, train | train_a | train_b | train_c (the benchmark's parts,
  # tasks.suite=bench: demonstrations from train_a, offline data from train_b, online rounds from train_c)
  c.demos = ml_collections.ConfigDict(dict(episodes=40, split="train"))
  c.il = config_lib.stage(steps=500, batch_size=8, lr=3e-3)

  # The IL actor's rollouts on the train tasks at the code's sampling temperature.
  c.offline = ml_collections.ConfigDict(dict(episodes=96, temperature=1.0, split="train"))

  c.features = ml_collections.ConfigDict(dict(text_dim=512, batch=32))  # bag-of-words buckets; image batch
  # Instruction-level critic (the code: 20 × 5 Adam steps of 256 trajectories, lr 1e-4, clip 0.01).
  c.traj_critic = config_lib.stage(steps=200, batch_size=32, lr=1e-3, clip_norm=1.0, warmup_steps=0,
                                   end_lr_ratio=1.0)
  c.traj_critic.hidden = 64
  # Step-level critic (the code: 20 × 5 steps of 128 transitions).
  c.critic = config_lib.stage(steps=400, batch_size=64, lr=1e-3, clip_norm=1.0, warmup_steps=0, end_lr_ratio=1.0)
  c.critic.hidden = 128

  # Actor (DigiRL offline and Filtered BC; the code: 30 × 20 steps of 128 samples, lr 1e-4).
  c.actor = config_lib.stage(steps=100, batch_size=8, lr=3e-4)
  c.actor.loss = "digirl"  # digirl: −mean(w · Σ log clip(p, 1e-3, 0.99)) | token_nll: per-token NLL
  c.actor.advantage = "code"  # code: V(s') − V(s) − 0.05 + r + G | dr: the paper's doubly-robust, w = 1[A > 1/H]
  c.actor.quantile = 0.9  # the trajectory filters keep the top 10 %
  # Weight of the demonstrations kept in every actor's mix (0 = the filtered data alone, the code): trained on a
  # few dozen kept trajectories alone the tiny actor forgets well-formed actions (docs/results/digirl.md#il-weight).
  c.actor.il_weight = 1.0

  # Online phase (off2on, online): per iteration, `episodes` rollouts of the current actor on train tasks, then
  # the critics and the actor continue training (the code: 16 episodes; 5, 5 and 20 steps). `max_lag` > 0 collects
  # each iteration with the actor that many updates back, while the newer ones train (pipeline/async_collect.py;
  # 0 = the code's alternation).
  c.online = ml_collections.ConfigDict(dict(iterations=2, episodes=32, temperature=1.0, max_lag=0, split="train"))
  c.online.traj_critic = config_lib.stage(steps=50, batch_size=32, lr=1e-3, clip_norm=1.0, warmup_steps=0,
                                          end_lr_ratio=1.0)
  c.online.critic = config_lib.stage(steps=100, batch_size=64, lr=1e-3, clip_norm=1.0, warmup_steps=0,
                                     end_lr_ratio=1.0)
  c.online.actor = config_lib.stage(steps=50, batch_size=8, lr=3e-4)

  # episodes drawn from the test split: 0 = each held-out intent once per policy, the protocol (repeating the
  # episodes of 8 intents is not a larger sample; the figures before 2026-11-27 drew 100); with tasks.suite=bench
  # the negative control's intents are evaluated too, each once
  c.eval = ml_collections.ConfigDict(dict(episodes=0, temperature=1.0, seed=1))  # the code samples at T 1

  c.checkpoint.every = 100
  c.checkpoint.async_save = False  # the next stage reloads each checkpoint at once

  if arg.variant == "smoke":
    c.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
    c.data.image_size = 32
    c.tasks.max_steps = 6
    c.demos.episodes = 2
    c.il.train.update(steps=4, batch_size=4)
    c.offline.episodes = 4
    c.sampling.max_tokens = 24
    c.features.text_dim = 64
    c.traj_critic.train.update(steps=3, batch_size=2)
    c.critic.train.update(steps=3, batch_size=4)
    c.actor.train.update(steps=2, batch_size=2)
    c.online.update(iterations=1, episodes=2)
    c.online.traj_critic.train.update(steps=2, batch_size=2)
    c.online.critic.train.update(steps=2, batch_size=4)
    c.online.actor.train.update(steps=2, batch_size=2)
    c.eval.episodes = 2
    c.train.progress_bar = False
    c.checkpoint.every = 2
  elif arg.variant == "paper":
    c.model.hf_checkpoint = ml_collections.config_dict.placeholder(str)  # required: an AutoUI-size VLM directory
    c.data.seq_len = 1024
    c.data.image_size = 224
    c.tasks.templates = ""
    c.tasks.max_steps = 10
    c.env.workers = 16
    c.demos.episodes = 1000
    c.sampling.max_tokens = 128
    c.offline.episodes = 1552
    c.features.text_dim = 768
    c.traj_critic.update(config_lib.stage(steps=100, batch_size=256, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                          end_lr_ratio=1.0))
    c.critic.update(config_lib.stage(steps=100, batch_size=128, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                     end_lr_ratio=1.0))
    c.actor.update(config_lib.stage(steps=600, batch_size=128, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                    end_lr_ratio=1.0))
    c.online.update(iterations=400, episodes=16)
    c.online.traj_critic.update(config_lib.stage(steps=5, batch_size=256, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                                 end_lr_ratio=1.0))
    c.online.critic.update(config_lib.stage(steps=5, batch_size=128, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                            end_lr_ratio=1.0))
    c.online.actor.update(config_lib.stage(steps=20, batch_size=128, lr=1e-4, clip_norm=0.01, warmup_steps=0,
                                           end_lr_ratio=1.0))
    c.actor.il_weight = 0.0
    c.eval.episodes = 96
  elif arg.variant:
    raise ValueError(f"configs/digirl.py: unknown variant {arg.variant!r}; choose one of {VARIANTS}")
  if arg.text:
    if arg.variant == "paper":
      raise ValueError("configs/digirl.py:paper,text=1: the paper's path reads the screenshot; drop text=1")
    c.env.observation, c.env.browser, c.model.kind = "html", "text", "decoder"
    c.data.max_images = 0
    # ≥ the longest prompt + reply in the embedded tokenizer: the page's cut, the goal, ~130 reply tokens
    c.data.seq_len = 2560 if arg.variant != "smoke" else 1024
    if arg.variant == "smoke":
      c.data.page_chars = 600
  return c
