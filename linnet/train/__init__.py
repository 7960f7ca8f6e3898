"""Training from the same source: gradients through the generated PyTorch code, LoRA as a
program transform, SFT and DPO trainers (docs/training.md, issue 17)."""
