"""Weights maps: one declarative manifest (TOML) per Hugging Face architecture."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
