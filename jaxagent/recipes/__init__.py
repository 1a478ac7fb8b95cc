"""Recipe registry: `config.recipe` → the module whose `run(config, workdir)` trains it.

Modules are imported on demand so that a recipe's dependencies load only when it runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

RECIPES: dict[str, str] = {
    "il": "jaxagent.recipes.il",
    "openwebvoyager": "jaxagent.recipes.openwebvoyager",
    "digiq": "jaxagent.recipes.digiq",
    "digirl": "jaxagent.recipes.digirl",
    "webrl": "jaxagent.recipes.webrl",
    "grpo": "jaxagent.recipes.grpo",
    "pretrain": "jaxagent.recipes.pretrain",
}


def get(name: str) -> ModuleType:
  if name not in RECIPES:
    raise ValueError(f"config.recipe={name!r} is not a recipe; choose one of {sorted(RECIPES)} "
                     "(or register it in jaxagent/recipes/__init__.py)")
  return importlib.import_module(RECIPES[name])
