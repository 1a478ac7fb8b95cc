"""Agent formats: prompt builders, action parsers and renderers for each reimplemented system.

`get_format(name, **flags)` returns one of: "webvoyager" (GPT-4o set-of-marks), "webvoyager_text"
(a11y tree only), "webvoyager_actree_image" (OpenWebVoyager's GPT-4o teacher), "openwebvoyager"
(idefics2 open model), "webrl" (Llama-3 completion over simplified HTML), "autoui" (AitW / DigiRL /
Digi-Q), "autoui_text" (AutoUI over the phone's simplified HTML, for a text decoder). See `base.AgentFormat`
for the interface.
"""

from jaxagent.agents import autoui  # noqa: F401  (registers "autoui")
from jaxagent.agents import autoui_text  # noqa: F401  (registers "autoui_text")
from jaxagent.agents import openwebvoyager  # noqa: F401  (registers "openwebvoyager")
from jaxagent.agents import webrl  # noqa: F401  (registers "webrl")
from jaxagent.agents import webvoyager  # noqa: F401  (registers the three WebVoyager variants)
from jaxagent.agents.base import AgentFormat, Prompt, format_names, get_format, to_openai_messages

__all__ = ["AgentFormat", "Prompt", "format_names", "get_format", "to_openai_messages"]
