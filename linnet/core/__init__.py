"""The bottom layer: shape algebra, diagnostics and the dtype table, which every other
layer (syntax, check, ir, backends, weights) may import and which import none of them."""
