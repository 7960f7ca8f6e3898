"""Weights maps: one declarative weights map (TOML) per Hugging Face architecture."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
