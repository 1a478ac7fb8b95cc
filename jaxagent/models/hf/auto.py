"""Which module reads a HF vision-language checkpoint, by its `config.json` `model_type`.

Each module has `config_from_dir(path)`, `load_pretrained(path, mesh)`, `save_pretrained(model, cfg, path, ...)`
and (LLaVA, idefics2) `image_preprocessing(path)`; `models.build`, `serving.checkpoint` and `export` go through
here. Qwen2.5-VL's images are fixed-resolution patches (`models.qwen_vl.QwenImages`), not `vit` images.
"""

from __future__ import annotations

import importlib
from types import ModuleType

VLM_MODULES = {"llava": "llava", "idefics2": "idefics2", "qwen2_5_vl": "qwen2_vl"}


def vlm_module(hf_config: dict) -> ModuleType:
  kind = hf_config.get("model_type")
  if kind not in VLM_MODULES:
    raise ValueError(f"config.json model_type={kind!r} is not a vision-language model jaxagent reads; "
                     f"supported: {sorted(VLM_MODULES)}")
  return importlib.import_module(f"jaxagent.models.hf.{VLM_MODULES[kind]}")
