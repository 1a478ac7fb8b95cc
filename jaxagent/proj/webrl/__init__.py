"""WebRL (`reference/algorithms.md` §3): its rows, warm-up, ORM, critic, curriculum and replay buffer."""
