"""The LLaVA processor: HF's image processor for pixels, one placeholder per patch feature.

Each image is resized and cropped by the model's image processor (CLIPImageProcessor or
SiglipImageProcessor) to the vision tower's size, so every image of a request yields
(H / patch) * (W / patch) features, plus CLIP's CLS row, minus the tower's first row under
vision_feature_select_strategy "default" (as transformers counts them). The prompt puts one image token where each image goes (text "<image>", or its id
in input_ids); it is expanded here to that count.
"""

from __future__ import annotations

from typing import Any

from mini_sglang.multimodal.processors.base_processor import (
    BaseMultimodalProcessor,
    expand_image_tokens,
    image_items,
)


class LlavaImageProcessor(BaseMultimodalProcessor):
    models = ["LlavaForConditionalGeneration"]

    def __init__(self, hf_config: Any, server_args: Any, processor: Any) -> None:
        super().__init__(hf_config, server_args, processor)
        cfg = hf_config
        self.im_token_id = getattr(cfg, "image_token_id", None)
        if self.im_token_id is None:
            self.im_token_id = cfg.image_token_index
        self.patch_size = cfg.vision_config.patch_size
        # Rows beyond the patches: CLIP's tower adds a CLS row, SigLIP's none; the
        # "default" strategy drops the tower's first row (transformers' LLaVA rule).
        extra = getattr(processor, "num_additional_image_tokens", None)
        if extra is None:
            extra = int(cfg.vision_config.model_type == "clip_vision_model")
        default = getattr(cfg, "vision_feature_select_strategy", "default") == "default"
        self.extra_rows = extra - int(default)
        self.tokenizer = getattr(processor, "tokenizer", None)
        self.image_processor = getattr(processor, "image_processor", processor)

    @property
    def image_token(self) -> str:
        token = getattr(self._processor, "image_token", None)
        if token is None and self.tokenizer is not None:
            token = self.tokenizer.convert_ids_to_tokens(self.im_token_id)
        return token or "<image>"

    def process_mm_data(
        self, image_data: list[Any], input_text: str | list[int], request_obj: Any
    ) -> dict[str, Any]:
        images = self.load_images(image_data)
        if isinstance(input_text, str):
            input_ids = self.tokenizer.encode(input_text)
        else:
            input_ids = list(input_text)
        pixel_values = self.image_processor(images=images, return_tensors="pt")["pixel_values"]
        h, w = pixel_values.shape[-2:]
        count = (h // self.patch_size) * (w // self.patch_size) + self.extra_rows
        ids, offsets = expand_image_tokens(
            input_ids, self.im_token_id, [count] * len(images), self.image_token
        )
        features = [pixel_values[k : k + 1] for k in range(len(images))]
        return {
            "input_ids": ids,
            "mm_items": image_items(features, offsets),
            "im_token_id": self.im_token_id,
        }
