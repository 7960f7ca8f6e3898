"""What the model objects (PyTorch and JAX) know about an entry's inputs from their names.

A source names its entry inputs; two names carry a meaning for the runtime:
token ids (checked against the vocab; one sequence may be given as a 1-D array) and
padding masks (1 = a valid position, 0 = padding; left out, every position is valid).
"""

TOKEN_INPUTS = ("tokens", "ids")
MASK_INPUTS = ("mask", "attention_mask")
