"""The Qwen2.5-VL processor: HF's Qwen2-VL image processor, image-pad expansion, M-RoPE.

The image processor resizes each image to multiples of patch_size * merge_size within its
min/max pixel budget and flattens it into patches: pixel_values [t * h * w, C * T * P * P]
with image_grid_thw (t, h, w) in patches. The vision tower merges merge_size**2 patches into
one language-model token, so the image's `<|image_pad|>` is expanded to t * h * w /
merge_size**2 tokens. A prompt marks each image with `<|vision_start|><|image_pad|>
<|vision_end|>` (what Qwen2.5-VL's chat template writes; SGLang's image token for this
family). The prompt's M-RoPE positions are computed here, once per request
(multimodal/mrope.py).

Only the processor's tokenizer and image processor are used (processors.get_processor
falls back to those two where transformers cannot build Qwen2.5-VL's AutoProcessor).
"""

from __future__ import annotations

from typing import Any

import torch

from mini_sglang.multimodal.mm_inputs import Modality, MultimodalDataItem
from mini_sglang.multimodal.mrope import get_rope_index
from mini_sglang.multimodal.processors.base_processor import (
    BaseMultimodalProcessor,
    expand_image_tokens,
)

IMAGE_TOKEN = "<|vision_start|><|image_pad|><|vision_end|>"


class QwenVLImageProcessor(BaseMultimodalProcessor):
    models = ["Qwen2_5_VLForConditionalGeneration"]

    def __init__(self, hf_config: Any, server_args: Any, processor: Any) -> None:
        super().__init__(hf_config, server_args, processor)
        self.im_token_id = hf_config.image_token_id
        self.spatial_merge_size = hf_config.vision_config.spatial_merge_size
        self.tokenizer = getattr(processor, "tokenizer", None)
        self.image_processor = getattr(processor, "image_processor", processor)

    @property
    def image_token(self) -> str:
        return IMAGE_TOKEN

    def process_mm_data(
        self, image_data: list[Any], input_text: str | list[int], request_obj: Any
    ) -> dict[str, Any]:
        """Expanded input ids, one item per image (feature: its pixel_values rows;
        image_grid_thw [1, 3]) and the prompt's M-RoPE positions (see the module docstring)."""
        images = self.load_images(image_data)
        if isinstance(input_text, str):
            input_ids = self.tokenizer.encode(input_text)
        else:
            input_ids = list(input_text)
        out = self.image_processor(images=images, return_tensors="pt")
        grid = torch.as_tensor(out["image_grid_thw"], dtype=torch.int64).reshape(-1, 3)
        patches = grid.prod(-1).tolist()
        counts = [n // self.spatial_merge_size**2 for n in patches]
        ids, offsets = expand_image_tokens(input_ids, self.im_token_id, counts, self.image_token)
        items = []
        for k, (pixels, span) in enumerate(zip(out["pixel_values"].split(patches), offsets)):
            item = MultimodalDataItem(
                modality=Modality.IMAGE,
                feature=pixels,
                offsets=[span],
                model_specific_data={"image_grid_thw": grid[k : k + 1]},
            )
            item.set_pad_value()
            items.append(item)
        positions, delta = get_rope_index(ids, self.im_token_id, grid, self.spatial_merge_size)
        return {
            "input_ids": ids,
            "mm_items": items,
            "im_token_id": self.im_token_id,
            "mrope_positions": positions,
            "mrope_position_delta": torch.tensor([[delta]], dtype=torch.int64),
        }
