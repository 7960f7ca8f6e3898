"""Tensor parallelism (issue 19): a sharding plan derived from a program's Core IR, the
per-rank rewrite that inserts collectives, and per-rank slices of a checkpoint.
docs/parallel.md."""
