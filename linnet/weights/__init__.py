"""Checkpoints in, source params out: the weights maps and the checkpoint layer.

    from linnet.weights.checkpoint import open_checkpoint
    ck = open_checkpoint("folder-or-file.gguf", dtype="f32")   # source, config, hf_config
    params = ck.numpy_params()                                 # or ck.torch_params(device)

Modules: `maps/` (weights maps: TOML -> `WeightsMap`), `safetensors_io` and
`gguf_checkpoint` (the two readers: headers, config, tensor reads), `plan` and
`plan_checks` (one plan for both, from headers only, as small named row checks),
`tensor_group` (a plan's row and a stream's group), `checkpoint` (what the front doors
load), `stream` and `gguf_reader` (the writers' `Weights` stream), `casting` (numpy casts
bit-exact with torch), `gguf_metadata` (typed GGUF metadata and computed tensors).
"""
