"""jaxagent: multimodal web-browsing and device-control agents in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="jaxagent",
    version="0.1.0",
    description="OpenWebVoyager, WebRL, DigiRL and Digi-Q in one JAX/Flax codebase, reproducible on one CPU.",
    packages=find_packages(include=["jaxagent", "jaxagent.*"]),
    package_data={"jaxagent": ["envs/sites/**/*", "envs/js/*", "assets/*", "judges/assets/digirl/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "grain>=0.2.18",
        "transformers>=5.0",
        "tokenizers",
        "safetensors",
        "playwright>=1.50",
        "miniwob>=1.0",
        "openai>=1.0",
        "ml-collections>=1.0",
        "absl-py",
        "tensorboardX",
        "tensorboard",
        "tqdm",
        "numpy",
        "pillow",
        "psutil",
        "fastapi",
        "uvicorn",
        "python-multipart",  # form posts on the bundled sites (starlette Request.form)
        "httpx",
        "selectolax>=1.0",  # the text backend parses the sites' pages as Chromium does (HTML5, lexbor)
        "gguf>=0.17",  # GGUF import (models/hf/gguf.py): SmolLM2 and other llama.cpp files
    ],
    extras_require={
        "cuda12": ["jax[cuda12]>=0.10"],
        "ray": ["ray>=2.60"],  # config.env.backend="ray": rollout workers as Ray actors (envs/ray_pool.py)
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "torch==2.13.0", "accelerate",  # accelerate: transformers' gguf_file
                 "ray>=2.60"],
        # BrowserGym (benchmarks/env_throughput.py's reference) pins an older Playwright: install it with
        # --no-deps as that benchmark's docstring says, not through an extra.
        "bench": ["torch==2.13.0"],
    },
)
