"""The jax backend: see docs/architecture.md."""
