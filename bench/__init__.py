"""Benchmarks: run.py (decoders), convert.py (HF -> GGUF), encoders.py (encoders, vision)."""
