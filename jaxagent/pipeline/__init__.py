"""The parts every recipe is made of, so that a recipe is its stages in order, a loss and a config.

  stages    `Stages(workdir, tag, config)`: one directory and an atomic `DONE` per stage, skip-when-done,
            timings, and a warning when a finished stage ran with other config values; atomic file writes
  config    `stage_config(config, section)`: a stage's `train` / `optim` blocks over the shared ones;
            `validate(config, choices)`: enumerated values and paths refused before any work
  tasks     task-suite I/O and seeded episode draws (`draw_episodes`, `disjoint_sets`), `success_rate`
  rollout   `Rollouts` / `rollout`: tasks through an `EnvPool`, judged, into a `TrajectoryStore`; resumes by
            episode id
  policy    `ModelPolicy` and `load`: a trained actor acting as its `agent.json` says, prompted with the training
            render
  evaluate  `evaluate_actors(config, actors, tasks, out)`: every actor on the same episodes, one scheduling;
            `write_results` with the provenance
  finetune  `finetune(config, workdir, items, agent=..., init_from=...)`: tokenizer → `models.build` → Grain →
            `loop.train`, with any per-sample weight (`weighted_nll`); an actor's `agent.json`
  device    the AutoUI phone agent of Digi-Q and DigiRL: env, samples, the IL stage
  scoring   a text model's reading of samples: reply log-probs, logits, the state at the reply's start
  seeds     `--seeds`: the recipe once per global seed, the results combined
  provenance  the commit, package versions and machine a result was measured with
"""
