"""Format converters: HF safetensors, GGUF and ONNX import and export.

Installed as `linnet.converters`. Each converter reads the same weights maps as
the loader (`weights_maps/`), so names and transforms are written once. The HF
import lives in `linnet.weights` today; exports arrive with the exports issue.
"""
