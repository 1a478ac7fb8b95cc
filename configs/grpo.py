"""Group-relative online RL on MiniWoB++: IL from scripted solvers, then GRPO rounds, evaluated on held-out seeds.

  python -m jaxagent.main --config=configs/grpo.py --workdir=/tmp/grpo

The bare file is the embedded default (a laptop CPU, no download): the MiniWoB++ tasks whose answer the page's own
DOM gives and whose test seeds are distinct instances (`envs.miniwob.HEADLINE_TASKS`, 33 tasks), each with
`tasks.train_seeds` train instances and `tasks.test_seeds` held-out instances (disjoint seed ranges); WebRL's
simplified HTML and action grammar; a tiny text decoder trained from scratch on the solvers' demonstrations
(tokenizer fitted on them), then GRPO rounds in real Chromium. The budget (demonstrations, rounds, held-out seeds)
is what fits ~15 minutes a seed on the 2-core machine, where a MiniWoB++ episode in Chromium costs ~3 s a worker.
Figures: docs/results/grpo.md.

Keys a researcher changes first:
  grpo.advantage       grpo ((R − mean) / std within the group) | dr_grpo (R − mean) | gigpo (grpo + the step-level
                       term over identical states, `gigpo_gamma`, `step_weight`)
  grpo.group_size      rollouts per task from one reset (G)
  grpo.reward          env (MiniWoB++'s own: −1 for a wrong end, 0 for running out of steps) | success (the judge's
                       1 or 0)
  tasks.page_clock     False: the step limit ends an episode (the default) | True: each page's wall-clock limit too
  grpo.clip_low/high   PPO's ε (DAPO's clip-higher: clip_high 0.28)
  grpo.kl_coef         β of the k3 KL to the IL start (verl-agent's 0.01; 0 = none, and no reference is scored)
  grpo.loss_agg        token_mean (verl's default) | seq_mean_token_mean (GRPO's paper) | seq_mean_token_sum_norm (Dr.
                       GRPO: each reply's token sum ÷ the generation budget `sampling.max_tokens`)
  grpo.max_lag         rounds collected by weights this many rounds old, corrected by decoupled PPO (behaviour
                       weights capped at `behaviour_weight_cap`), in a thread beside the learner's updates
  model.lora.rank      > 0 trains low-rank adapters only (the SmolLM2 variant)

Variants (`configs/grpo.py:<name>`):
  smoke   a handful of episodes and updates per stage: the end-to-end test (`tests/recipes/test_grpo.py`).
  smollm  SmolLM2-135M-Instruct (real pretrained weights, offline) with LoRA rank 8 as the policy.
"""

from __future__ import annotations

import ml_collections

from jaxagent import config_lib

VARIANTS = ("smoke", "smollm")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, variant="")
  c = config_lib.base_config(staged=True)
  c.recipe = "grpo"
  c.suite = "miniwob"
  c.prompt_chars = 4096  # the WebRL format's cut of the HTML (MiniWoB's pages are far shorter)

  c.model = config_lib.vlm_model()
  c.model.kind = "decoder"
  # seq_len: IL's training length; the GRPO learner trains each round at its longest step's (the sampler takes any
  # prompt the model's context holds)
  c.data = ml_collections.ConfigDict(dict(tokenizer="demos", seq_len=1024, image_size=64, max_images=0,
                                          num_threads=2))
  # "" = envs.miniwob.HEADLINE_TASKS; train / test seeds per task (disjoint ranges)
  # page_clock: False = the step limit `max_steps` alone ends an episode the page does not; True = each page's own
  # wall-clock limit too (MiniWoB++'s `core.EPISODE_MAX_TIME`, 7-30 s, ending with −1), the `miniwob` package's
  # behaviour, under which a reward depends on the machine's and the model's speed
  c.tasks = ml_collections.ConfigDict(dict(names="", train_seeds=200, test_seeds=4, max_steps=6, page_clock=False))
  c.env = config_lib.env_block(workers=4)
  c.sampling = ml_collections.ConfigDict(dict(max_tokens=48, max_batch=32))

  c.demos = ml_collections.ConfigDict(dict(episodes=200))
  c.il = config_lib.stage(steps=400, batch_size=8, lr=1e-3)

  c.grpo = ml_collections.ConfigDict(dict(
      rounds=10, tasks_per_round=6, group_size=6, temperature=1.0, advantage="grpo", gigpo_gamma=0.95,
      step_weight=1.0, epochs=2, clip_low=0.2, clip_high=0.2, kl_coef=0.01, loss_agg="token_mean",
      max_lag=0, behaviour_weight_cap=5.0, checkpoint_every=5, reward="env"))
  # train.batch_size: the steps of one update (the last of a pass filled from its start); a constant learning rate
  # after a short warm-up (train.steps only bounds the schedule)
  c.grpo.update(config_lib.stage(steps=2000, batch_size=16, lr=1e-4, warmup_steps=10, end_lr_ratio=1.0))

  c.eval = ml_collections.ConfigDict(dict(temperature=0.0, seed=0))
  c.checkpoint.every = 200
  c.checkpoint.async_save = False

  if arg.variant == "smoke":
    c.model.decoder.update(hidden_size=64, num_layers=1, head_dim=16, intermediate_size=128)
    c.tasks.update(names="click-button,click-link", train_seeds=4, test_seeds=2, max_steps=3)
    c.env.workers = 2
    c.sampling.max_tokens = 32  # a whole reply: at 16 the WebRL action was cut, every episode malformed, no update
    c.demos.episodes = 8
    c.il.update(config_lib.stage(steps=150, batch_size=4, lr=3e-3))  # clicks something: a group's rewards differ
    c.grpo.update(rounds=2, tasks_per_round=2, group_size=2, epochs=1, checkpoint_every=1)
    c.grpo.train.update(steps=20, batch_size=4)
    c.train.progress_bar = False
    c.checkpoint.every = 2
  elif arg.variant == "smollm":
    c.model.hf_checkpoint = "smollm2"
    c.model.lora.rank = 8
    c.data.tokenizer = ""
    c.il.update(config_lib.stage(steps=300, batch_size=4, lr=3e-4))
    c.grpo.update(config_lib.stage(steps=2000, batch_size=16, lr=1e-5, warmup_steps=10, end_lr_ratio=1.0))
  elif arg.variant:
    raise ValueError(f"configs/grpo.py: unknown variant {arg.variant!r}; choose one of {VARIANTS}")
  return c
