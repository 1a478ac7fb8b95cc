"""Training machinery shared by every recipe: state, step builder, checkpoints, metrics, profiling, MFU.

Recipes call `jaxagent.train.loop.train(config, workdir, model_fn=..., loss_fn=..., dataset=...)`.
"""
