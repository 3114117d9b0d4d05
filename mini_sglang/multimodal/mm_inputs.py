"""The multimodal data contract (SGLang 0.5.4's names from managers/schedule_batch.py).

A request's images become one ``MultimodalDataItem`` each (SGLang groups a modality's
images into one item; one per image gives every image its own content hash, pad value and
offsets, so the radix cache can share a repeated image and never confuses two). They travel
in one ``MultimodalInputs`` per request:

  TokenizerManager  processor: pixel features, hashes, pad values, expanded input ids
      | (pickled inside TokenizedGenerateReqInput.mm_inputs)
  Scheduler         model.pad_input_ids(ids, mm_inputs): each run of im_token_id becomes
                    the item's pad_value and item.offsets records where it lies; the padded
                    ids are the Req's origin_input_ids (radix key), the unpadded ones are
                    kept for detokenization, penalties and logprobs
  ForwardBatch      mm_inputs: per extend row its MultimodalInputs (None for text rows)
  model             general_mm_embed_routine (mm_utils.py) scatters the image features
                    into the rows of this extend chunk

Offsets are half-open (start, end) token index ranges of the padded prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
from enum import Enum, auto
from typing import Any

import numpy as np
import torch

# Pad values live in [0, 2**30) as in SGLang; text rows are told from image rows by the
# items' offsets, never by value, so a pad value equal to a real token id does no harm.
PAD_VALUE_RANGE = 1 << 30


class Modality(Enum):
    IMAGE = auto()
    MULTI_IMAGES = auto()
    VIDEO = auto()
    AUDIO = auto()

    @staticmethod
    def from_str(modality_str: str) -> Modality:
        """The modality named (case-insensitive); ValueError listing the valid names."""
        try:
            return Modality[modality_str.upper()]
        except KeyError:
            raise ValueError(
                f"Invalid modality string: {modality_str}. "
                f"Valid modalities are: {[m.name for m in Modality]}"
            ) from None


def hash_feature(feature: Any, extra: dict[str, Any] | None = None) -> int:
    """A 64-bit content hash of a processor feature (tensor, array or nested list) and of
    the model-specific data beside it (e.g. image_grid_thw): equal images processed the
    same way hash equal, in any process."""
    h = hashlib.sha256()
    _update_hash(h, feature)
    for key in sorted(extra or {}):
        h.update(key.encode())
        _update_hash(h, extra[key])
    return int.from_bytes(h.digest()[:8], "little")


def _update_hash(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _update_hash(h, v)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


@dataclasses.dataclass
class MultimodalDataItem:
    """One image (or other modality item) of a request.

    feature: the processor's output for the model's encoder (e.g. pixel_values
      [1, 3, H, W] for LLaVA, flattened patches for Qwen2.5-VL).
    model_specific_data: whatever else the model's get_image_feature needs (e.g.
      image_grid_thw); read as attributes (``item.image_grid_thw``).
    hash / pad_value: set by ``set_pad_value`` from the content (feature and
      model_specific_data); pad_value = hash % 2**30 stands in for each of the item's
      placeholder tokens in the padded input ids.
    offsets: [(start, end)] half-open token ranges of the padded prompt the item fills
      (set by pad_input_ids); their total length is the item's number of feature rows.
    """

    modality: Modality
    hash: int | None = None
    pad_value: int | None = None
    offsets: list[tuple[int, int]] | None = None
    feature: Any = None
    precomputed_embeddings: torch.Tensor | None = None
    model_specific_data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("model_specific_data")
        if data is not None and name in data:
            return data[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def set_pad_value(self) -> None:
        """Hash the content (unless a hash is set) and derive pad_value from it."""
        if self.hash is None:
            content = self.feature if self.feature is not None else self.precomputed_embeddings
            self.hash = hash_feature(content, self.model_specific_data)
        self.pad_value = self.hash % PAD_VALUE_RANGE

    def is_image(self) -> bool:
        return self.modality in (Modality.IMAGE, Modality.MULTI_IMAGES)

    def num_tokens(self) -> int:
        """Placeholder tokens the item fills (after pad_input_ids set its offsets)."""
        return sum(end - start for start, end in self.offsets or ())


@dataclasses.dataclass
class MultimodalInputs:
    """A request's multimodal inputs (SGLang's fields that mini-sglang uses).

    mm_items: the items in prompt order (the k-th run of im_token_id is mm_items[k]).
    im_token_id: the placeholder token id the processor expanded per image.
    mrope_positions: int64 [3, prompt_len] M-RoPE positions of the padded prompt (models
      with multimodal rotary embeddings, e.g. Qwen2.5-VL); None otherwise.
    mrope_position_delta: int64 [1, 1]: a generated token at sequence position p has M-RoPE
      position p + delta on all three axes.
    The model caches each request's image features here across the chunks of a chunked
    prefill (``feature_cache``, dropped once the last image row is computed; never pickled
    with content since the scheduler only creates it in-process).
    """

    mm_items: list[MultimodalDataItem]
    im_token_id: int | None = None
    mrope_positions: torch.Tensor | None = None
    mrope_position_delta: torch.Tensor | None = None
    feature_cache: dict[int, torch.Tensor] | None = None

    @staticmethod
    def from_dict(obj: dict[str, Any]) -> MultimodalInputs:
        """From a processor's output dict (mm_items, im_token_id, mrope_*), setting the
        pad value of each item that has none yet (processors set them off the scheduler)."""
        ret = MultimodalInputs(
            mm_items=list(obj["mm_items"]),
            im_token_id=obj.get("im_token_id"),
            mrope_positions=obj.get("mrope_positions"),
            mrope_position_delta=obj.get("mrope_position_delta"),
        )
        for item in ret.mm_items:
            if item.pad_value is None:
                item.set_pad_value()
        return ret

    def image_items(self) -> list[MultimodalDataItem]:
        return [item for item in self.mm_items if item.is_image()]

    def drop_feature_cache(self) -> None:
        self.feature_cache = None
