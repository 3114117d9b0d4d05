"""The model side of multimodal inputs (SGLang 0.5.4's managers/mm_utils.py names).

A multimodal model implements the ``MultimodalModel`` interface:

  pad_input_ids(input_ids, mm_inputs) -> list[int]
      the prompt with every placeholder token of item k replaced by item k's pad_value
      (called once per request by the scheduler; the result is the radix-cache key, so a
      repeated image shares its KV and two different images never do);
  get_image_feature(items) -> Tensor [sum of the items' placeholder counts, hidden]
      the language-model input embeddings of the items' placeholder rows, items in order;
  forward(input_ids, positions, fb) calling
      general_mm_embed_routine(input_ids, fb, language_model, multimodal_model, positions).

``general_mm_embed_routine`` embeds the text rows with the language model's embedding table,
computes each request's image features once (cached on its MultimodalInputs across the
chunks of a chunked prefill, dropped when the chunk holding the last image row ran) and
scatters into this extend chunk the rows its token range covers, then runs the language
model on the embeddings. Decode batches and extends without images take the text path
unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from mini_sglang.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs

if TYPE_CHECKING:
    from torch import nn

    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class MultimodalModel(Protocol):
    """What the scheduler and general_mm_embed_routine need of a multimodal model."""

    def pad_input_ids(self, input_ids: list[int], mm_inputs: MultimodalInputs) -> list[int]: ...

    def get_image_feature(self, items: list[MultimodalDataItem]) -> torch.Tensor: ...


class MultiModalityDataPaddingPatternMultimodalTokens:
    """Placeholders as repetitions of one token (<image><image>...<image>): each item's
    offsets (set by the processor) are overwritten with its pad_value."""

    def pad_input_tokens(self, input_ids: list[int], mm_inputs: MultimodalInputs) -> list[int]:
        """input_ids with item k's offset ranges set to item k's pad_value. ValueError when
        an item has no offsets or one reaches past the prompt, or its ranges are not all
        placeholder tokens (the processor and the prompt disagree)."""
        ids = list(input_ids)
        for item in mm_inputs.mm_items:
            if not item.offsets:
                raise ValueError(f"A {item.modality.name.lower()} item has no placeholder tokens.")
            for start, end in item.offsets:
                if not 0 <= start < end <= len(ids):
                    raise ValueError(f"Placeholder range ({start}, {end}) is outside the prompt.")
                token = mm_inputs.im_token_id
                if token is not None and any(t != token for t in ids[start:end]):
                    raise ValueError(f"Placeholder range ({start}, {end}) is not all image tokens.")
                ids[start:end] = [item.pad_value] * (end - start)
        return ids


def general_mm_embed_routine(
    input_ids: torch.Tensor,
    fb: ForwardBatch,
    language_model: nn.Module,
    multimodal_model: MultimodalModel,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The language model's hidden states for this batch, image rows embedded from the
    items' features. language_model(input_ids, positions, fb, input_embeds=...) must take
    embeddings instead of ids, and expose its embedding table as ``embed_tokens``."""
    if not (fb.forward_mode.is_extend() and fb.contains_mm_inputs()):
        return language_model(input_ids, positions, fb)
    embeds = embed_mm_inputs(input_ids, fb, language_model.embed_tokens, multimodal_model)
    return language_model(input_ids, positions, fb, input_embeds=embeds)


def embed_mm_inputs(
    input_ids: torch.Tensor,
    fb: ForwardBatch,
    embed_tokens: nn.Module,
    multimodal_model: MultimodalModel,
) -> torch.Tensor:
    """[extend tokens, hidden] embeddings: text rows from embed_tokens, the image rows this
    chunk covers from the items' features."""
    rows, locs = [], []
    start_of_req = 0  # where request i's tokens start in the flat extend arrays
    lens = zip(fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu)
    for mm_inputs, (prefix, extend) in zip(fb.mm_inputs, lens):
        if mm_inputs is not None:
            r, loc = _chunk_rows(mm_inputs, prefix, prefix + extend, multimodal_model)
            rows += r
            locs += [x + start_of_req for x in loc]
        start_of_req += extend
    if not rows:
        return embed_tokens(input_ids)
    loc = torch.cat(locs).to(input_ids.device)
    # Pad values may lie outside the vocabulary: those rows are overwritten below.
    text_ids = input_ids.clone()
    text_ids[loc] = 0
    embeds = embed_tokens(text_ids)
    embeds[loc] = torch.cat(rows).to(embeds.device, embeds.dtype)
    return embeds


def _chunk_rows(
    mm_inputs: MultimodalInputs, lo: int, hi: int, model: MultimodalModel
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(feature rows, their positions relative to lo) of the items' placeholder rows in the
    token range [lo, hi) of one request."""
    items = mm_inputs.mm_items
    if not any(s < hi and lo < e for item in items for s, e in item.offsets or ()):
        return [], []
    if mm_inputs.feature_cache is None:
        mm_inputs.feature_cache = _features_by_item(items, model)
    rows, locs = [], []
    for k, item in enumerate(items):
        feature = mm_inputs.feature_cache[k]
        row = 0  # the item's first feature row of the current range
        for s, e in item.offsets:
            a, b = max(s, lo), min(e, hi)
            if a < b:
                rows.append(feature[row + a - s : row + b - s])
                locs.append(torch.arange(a - lo, b - lo))
            row += e - s
    if hi >= max(e for item in items for _, e in item.offsets):
        mm_inputs.drop_feature_cache()  # every image row is computed; free the features
    return rows, locs


def _features_by_item(
    items: list[MultimodalDataItem], model: MultimodalModel
) -> dict[int, torch.Tensor]:
    """Each item's feature rows, computed in one get_image_feature call per request."""
    out: dict[int, torch.Tensor] = {}
    images = [k for k, item in enumerate(items) if item.is_image()]
    if len(images) != len(items):
        kinds = sorted({item.modality.name for item in items if not item.is_image()})
        raise ValueError(f"Unsupported modalities: {kinds}")
    feature = model.get_image_feature([items[k] for k in images])
    counts = [items[k].num_tokens() for k in images]
    if feature.shape[0] != sum(counts):
        raise ValueError(
            f"The image features have {feature.shape[0]} rows for {sum(counts)} placeholders."
        )
    for k, part in zip(images, feature.split(counts)):
        out[k] = part
    return out
