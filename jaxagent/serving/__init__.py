"""Serving jaxagent policies: checkpoint loading/export, the batched inference engine, the batching queue.

The HTTP server itself is `jaxagent/serve.py` (`python -m jaxagent.serve`).
"""
