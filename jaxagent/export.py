"""A trained policy as a directory `transformers` loads and runs unchanged.

    python -m jaxagent.export --workdir W --stage il --out /tmp/il_hf [--step N]

`--stage` is a policy's training stage inside a recipe's workdir (`il`, `actor`, `grpo/actor`, ...: a directory
under W holding `checkpoints/` and the `config.json` its model is built from; without it the command lists them).
A critic's stage (heads on a backbone, checkpoints only) and an AutoUI actor (no `transformers` class) are not
exported and not listed. The output holds the weights and `config.json`
(`LlavaForConditionalGeneration` for a VLM, `LlamaForCausalLM` for a decoder), the tokenizer with its chat template,
`generation_config.json` with the stop tokens the policy stops at, and for a VLM the processor
(`preprocessor_config.json` for `LlavaImageProcessor`, `processor_config.json` for `LlavaProcessor`) that
preprocesses images and expands `<image>` as our engine does. A Qwen2.5-VL policy is written as
`Qwen2_5_VLForConditionalGeneration` with `preprocessor_config.json` for `Qwen2VLImageProcessor` fixed at the side
it was trained at. Then, with no other step:

    processor = AutoProcessor.from_pretrained(out); model = AutoModelForImageTextToText.from_pretrained(out)
    model.generate(**processor(text=processor.apply_chat_template(messages, add_generation_prompt=True),
                               images=[image], return_tensors="pt"))
"""

from __future__ import annotations

import argparse
import json
import os

from jaxagent.models import qwen_vl
from jaxagent.models.hf import idefics2
from jaxagent.serving.checkpoint import LoadedModel, export_policy, load_policy


def not_exportable(directory: str) -> str:
  """Why the training directory `directory` cannot be exported ("" when it can): a policy's stage holds the
  `config.json` its model is built from beside `checkpoints/`; a critic's has checkpoints only (`train.loop` on
  heads), and AutoUI's T5 has no export (`serving.checkpoint.export_policy`)."""
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    return "no config.json beside its checkpoints/ (a critic or value head, not a policy)"
  try:
    with open(path, encoding="utf-8") as f:
      kind = json.load(f).get("model", {}).get("kind")
  except (json.JSONDecodeError, AttributeError):
    return f"{path} is not a config's JSON object"
  return "an AutoUI actor (config.model.kind=autoui), which has no transformers export" if kind == "autoui" else ""


def stages(workdir: str) -> list[str]:
  """The policy stages under a recipe workdir that `export` can write: relative paths of the directories holding
  `checkpoints/` that `not_exportable` passes."""
  found = []
  for root, dirs, _ in os.walk(workdir):
    if "checkpoints" in dirs:
      if not not_exportable(root):
        found.append(os.path.relpath(root, workdir))
      dirs[:] = []  # a stage's own subdirectories are its checkpoints, not stages
  return sorted(found)


def _generation_config(policy: LoadedModel) -> dict:
  tok = policy.tokenizer
  eos = list(policy.eos_ids)
  return {"bos_token_id": tok.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos,
          "pad_token_id": policy.pad_id, "do_sample": False}


def _processor_configs(policy: LoadedModel) -> tuple[dict, dict]:
  """(preprocessor_config, processor_config) reproducing `policy.preprocess` and its image-token expansion."""
  pp, vision = policy.preprocess, policy.model.config.vision
  size = {"shortest_edge": pp.size} if pp.shortest_edge else {"height": pp.size, "width": pp.size}
  image = {"image_processor_type": "LlavaImageProcessor", "processor_class": "LlavaProcessor",
           "do_pad": pp.pad_to_square, "do_resize": True, "size": size, "resample": 3,  # PIL bicubic
           "do_center_crop": pp.crop_size is not None,
           "crop_size": {"height": pp.crop_size or pp.size, "width": pp.crop_size or pp.size},
           "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
           "image_mean": list(pp.mean), "image_std": list(pp.std), "do_convert_rgb": True}
  # LlavaProcessor writes (side / patch)² + num_additional_image_tokens image tokens, minus one for "default"
  # (the class token dropped): the tower's patch features, `policy.num_image_tokens` of them.
  strategy = "default" if vision.select_feature == "patch" else "full"
  processor = {"processor_class": "LlavaProcessor", "patch_size": vision.patch_size,
               "vision_feature_select_strategy": strategy, "num_additional_image_tokens": int(vision.class_token),
               "image_token": "<image>"}
  return image, processor


def _qwen_preprocessor_config(images: qwen_vl.QwenImages) -> dict:
  """`Qwen2VLImageProcessor` pinned to the export's one square side: min = max pixels = side², so a square image
  becomes the same patches as `QwenImages` gives (a non-square one keeps its aspect there, ours is stretched)."""
  v, pixels = images.config.vision, images.size * images.size
  return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
          "do_resize": True, "size": {"shortest_edge": pixels, "longest_edge": pixels}, "resample": 3,  # bicubic
          "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": list(images.mean),
          "image_std": list(images.std), "do_convert_rgb": True, "patch_size": v.patch_size,
          "temporal_patch_size": v.temporal_patch_size, "merge_size": v.spatial_merge_size}


def export(workdir: str, out: str, *, stage: str = "", step: int | None = None) -> str:
  """Writes `out` from the policy of `workdir/stage` (its latest step, or `step`); returns `out`."""
  source = os.path.join(workdir, stage) if stage else workdir
  if not os.path.isdir(os.path.join(source, "checkpoints")):
    found = stages(workdir) if os.path.isdir(workdir) else []
    raise FileNotFoundError(f"{source} is not a training stage (no checkpoints/ in it); stages under {workdir}: "
                            f"{', '.join(found) or 'none'} (pass one with --stage)")
  why = not_exportable(source)
  if why:
    raise ValueError(f"{source} cannot be exported: {why}; stages under {workdir} that can: "
                     f"{', '.join(stages(workdir)) or 'none'}")
  policy = load_policy(source, step=step)
  export_policy(policy, out, name=f"{os.path.basename(os.path.normpath(workdir))}/{stage}" if stage else "")
  with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as f:
    json.dump(_generation_config(policy), f, indent=2)
  if qwen_vl.is_qwen(policy):
    _write_json(os.path.join(out, "preprocessor_config.json"), _qwen_preprocessor_config(policy.preprocess))
  elif policy.kind == "vlm" and policy.model.config.perceiver is not None:
    idefics2.write_processor_config(policy.model.config, out)
  elif policy.kind == "vlm":
    image, processor = _processor_configs(policy)
    _write_json(os.path.join(out, "preprocessor_config.json"), image)
    _write_json(os.path.join(out, "processor_config.json"), processor)
  return out


def _write_json(path: str, data: dict) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m jaxagent.export", description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="a recipe's (or a training run's) workdir")
  p.add_argument("--stage", default="", help="the stage directory inside it (il, actor, ...); omit to list them")
  p.add_argument("--step", type=int, default=None, help="a checkpoint step (default: the latest)")
  p.add_argument("--out", required=True, help="the directory to write")
  args = p.parse_args(argv)
  print(f"exported to {export(args.workdir, args.out, stage=args.stage, step=args.step)}", flush=True)


if __name__ == "__main__":
  main()
