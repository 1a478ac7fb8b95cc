"""WebRL (`reference/algorithms.md` §3): its ORM, critic, curriculum and replay buffer on the shared layer."""
