"""BaseMultimodalProcessor: raw images + prompt -> expanded input ids + MultimodalInputs.

Runs in the TokenizerManager process. ``process_mm_data_async`` hands the work (loading
each image, the HF image processor, hashing) to a thread pool so the event loop never
blocks on it. A thread pool rather than SGLang's process pool: PIL decoding and the HF
image processors' numpy/torch kernels release the GIL for their heavy parts, and a
process pool would pickle the processor and every pixel tensor across processes for no
gain on the request sizes a server sees. Its size is SGLANG_IO_WORKERS.

Contract of the returned dict (what TokenizedGenerateReqInput.mm_inputs carries):
  input_ids    the prompt ids, each image's placeholder token expanded to its feature
               count (the count the model's get_image_feature returns for it)
  mm_items     one MultimodalDataItem per image, prompt order, with feature, offsets
               ((start, end) of its placeholder run in input_ids), hash and pad_value set
  im_token_id  the placeholder token id
  mrope_positions / mrope_position_delta  for models with M-RoPE (else absent)
Bad input (an unreadable or oversized image, a failing URL, more images than allowed, a
prompt whose image tokens do not match the images) raises ValueError naming the problem.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, ClassVar

from mini_sglang.environ import envs
from mini_sglang.multimodal.image_loading import ImageLimits, load_image
from mini_sglang.multimodal.mm_inputs import Modality, MultimodalDataItem


class BaseMultimodalProcessor:
    """One model family's processor. Subclasses list the HF architectures they serve in
    ``models`` and implement ``process_mm_data``."""

    models: ClassVar[list[str]] = []

    def __init__(self, hf_config: Any, server_args: Any, processor: Any) -> None:
        self.hf_config = hf_config
        self.server_args = server_args
        self._processor = processor
        self.limits = ImageLimits.from_env()
        self.max_images = envs.MINI_SGLANG_MAX_IMAGES_PER_REQUEST.get()
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, envs.SGLANG_IO_WORKERS.get()), thread_name_prefix="mm-processor"
        )

    @property
    def image_token(self) -> str:
        """The placeholder text a prompt puts where an image goes (e.g. "<image>")."""
        raise NotImplementedError

    async def process_mm_data_async(
        self,
        image_data: list[Any] | None,
        input_text: str | list[int],
        request_obj: Any = None,
        max_req_input_len: int | None = None,
        **kwargs: Any,
    ) -> dict[str, Any] | None:
        """The processed inputs (see the module docstring), or None without images."""
        images = [x for x in image_data or [] if x is not None]
        if not images:
            return None
        if len(images) > self.max_images:
            raise ValueError(
                f"The request has {len(images)} images; this model accepts at most "
                f"{self.max_images} per prompt."
            )
        loop = asyncio.get_running_loop()
        call = functools.partial(self.process_mm_data, images, input_text, request_obj)
        out = await loop.run_in_executor(self.executor, call)
        if max_req_input_len is not None and len(out["input_ids"]) > max_req_input_len:
            raise ValueError(
                f"The input ({len(out['input_ids'])} tokens with the images' placeholders) "
                f"is longer than the model's context length ({max_req_input_len} tokens)."
            )
        return out

    def process_mm_data(
        self, image_data: list[Any], input_text: str | list[int], request_obj: Any
    ) -> dict[str, Any]:
        """Synchronous body of process_mm_data_async (runs on the thread pool)."""
        raise NotImplementedError

    def load_images(self, image_data: list[Any]) -> list[Any]:
        """PIL images of the entries; ValueError naming the entry that fails."""
        images = []
        for i, data in enumerate(image_data):
            try:
                images.append(load_image(data, self.limits))
            except ValueError as e:
                raise ValueError(f"Image {i}: {e}") from None
        return images

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def expand_image_tokens(
    input_ids: list[int], im_token_id: int, counts: list[int], image_token: str
) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids with the k-th image token repeated counts[k] times, each image's (start, end)
    range in them). ValueError unless the prompt has exactly one image token per image."""
    found = sum(1 for t in input_ids if t == im_token_id)
    if found != len(counts):
        raise ValueError(
            f"The prompt has {found} image tokens ({image_token}) for {len(counts)} images; "
            f"put one {image_token} where each image goes."
        )
    out: list[int] = []
    offsets: list[tuple[int, int]] = []
    k = 0
    for t in input_ids:
        if t == im_token_id:
            offsets.append((len(out), len(out) + counts[k]))
            out.extend([im_token_id] * counts[k])
            k += 1
        else:
            out.append(t)
    return out, offsets


def image_items(features: list[Any], offsets: list[tuple[int, int]]) -> list[MultimodalDataItem]:
    """One hashed image item per feature, at its placeholder range."""
    items = []
    for feature, span in zip(features, offsets):
        item = MultimodalDataItem(modality=Modality.IMAGE, feature=feature, offsets=[span])
        item.set_pad_value()
        items.append(item)
    return items
