"""The parity gate: Linnet against transformers on the same weights and dtype.

    from linnet.parity import format_table, run_gate, write_record

    report = run_gate(folder, entry=entry, dtype="bf16")      # or a .gguf file
    print(format_table(report)); write_record(report)

One gate, one measure per kind of model (the entry's `kind`, or what the checkpoint's
source has: `decode` for decoders, `embed` for encoders, else vision):

* decoder: for each prompt, the last-position logits of both (Linnet through the decode
  entry, the path `generate` takes) give four figures: the same first greedy token (yes/no),
  max |Δ|, relative error ‖Δ‖₂ / ‖ref‖₂, and the overlap of the two top-5 sets;
* encoder: the prompts (sentences) as one padded batch; per prompt, `embed` against
  sentence-transformers' mean pooling over transformers' `AutoModel` last_hidden_state
  (max |Δ|, rel, cosine) and `forward` against last_hidden_state at the real tokens;
* vision: a batch of 2 images of deterministic random pixels at the config's size (no image
  files offline); every entry the class has (`forward`, `pool`, `classify`) against
  transformers' last_hidden_state, pooler_output and logits (max |Δ|, rel), and for
  `classify` the same top-1 class in every row;
* speech (Whisper): audio the gate makes, through Linnet's log-mel front end; the encoder
  output, the logits after generation_config.json's start tokens, and greedy tokens under
  the checkpoint's rules equal to transformers' `generate` (with the decode steps' logits
  along them);
* image-text (SigLIP): random pixels and token ids; `embed_image`, `embed_text`, `logits`
  against get_image_features, get_text_features, logits_per_image;
* image-decoder (a VAE's decoder): random latents; `decode` against diffusers'.
* segmenter (SAM): random pixels, then points and boxes on transformers' image
  embeddings; `embed_image`, masks and IoU scores (linnet/parity/segment.py).

A row passes when its figures are within the entry's tolerance for the backend and dtype;
the gate fails closed. Each run can write a parity record (JSON) that the site and model
cards read.

Modules, one concept each: `gate` (the run), `models` (loading both sides), `prompts`
(tokenizer and prompt ids), `decoder`, `encoder`, `vision`, `speech`, `images` (the
measures), `compare` (two outputs' figures and verdict), `report` (figures and report),
`table` (the text table), `records` (the JSON records).
"""

from linnet.parity.compare import compare, judge
from linnet.parity.decoder import measure_decoder
from linnet.parity.encoder import mean_pooling, measure_encoder, pad_batch
from linnet.parity.gate import FALLBACK_PROMPTS, FALLBACK_SENTENCES, Gate, run_gate
from linnet.parity.images import measure_image_decoder, measure_image_text
from linnet.parity.models import BACKENDS, checkpoint_kind, load_linnet, load_reference
from linnet.parity.prompts import encode_prompts, load_tokenizer
from linnet.parity.records import read_records, record, record_path, results_dir, write_record
from linnet.parity.report import OutputFigures, PromptFigures, Report, versions
from linnet.parity.speech import made_audio, measure_speech
from linnet.parity.table import format_table
from linnet.parity.vision import measure_vision, random_pixels, reference_vision

__all__ = [
    "BACKENDS",
    "FALLBACK_PROMPTS",
    "FALLBACK_SENTENCES",
    "Gate",
    "OutputFigures",
    "PromptFigures",
    "Report",
    "checkpoint_kind",
    "compare",
    "encode_prompts",
    "format_table",
    "judge",
    "load_linnet",
    "load_reference",
    "load_tokenizer",
    "made_audio",
    "mean_pooling",
    "measure_decoder",
    "measure_encoder",
    "measure_image_decoder",
    "measure_image_text",
    "measure_speech",
    "measure_vision",
    "pad_batch",
    "random_pixels",
    "read_records",
    "record",
    "record_path",
    "reference_vision",
    "results_dir",
    "run_gate",
    "versions",
    "write_record",
]
