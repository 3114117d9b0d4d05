"""The multimodal contract's pure parts: content hashes and pad values, placeholder
padding, placeholder expansion, image loading's refusals, the processor's chat template."""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from PIL import Image

from mini_sglang.multimodal.image_loading import ImageLimits, load_image
from mini_sglang.multimodal.mm_inputs import (
    PAD_VALUE_RANGE,
    Modality,
    MultimodalDataItem,
    MultimodalInputs,
    hash_feature,
)
from mini_sglang.multimodal.mm_utils import MultiModalityDataPaddingPatternMultimodalTokens
from mini_sglang.multimodal.processors import processor_chat_template
from mini_sglang.multimodal.processors.base_processor import expand_image_tokens

IMG = 7  # the placeholder token id in these tests
LIMITS = ImageLimits(max_bytes=10_000, max_pixels=64 * 64, fetch_timeout=1.0)


def _png(w: int, h: int, color=(10, 20, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def test_hash_is_content_and_side_data():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert hash_feature(a) == hash_feature(a.clone())
    assert hash_feature(a) != hash_feature(a + 1)
    assert hash_feature(a) != hash_feature(a.reshape(4, 3))  # same bytes, other shape
    grid = {"image_grid_thw": torch.tensor([[1, 2, 2]])}
    assert hash_feature(a, grid) != hash_feature(a)
    item = MultimodalDataItem(Modality.IMAGE, feature=a, model_specific_data=grid)
    item.set_pad_value()
    assert item.pad_value == item.hash % PAD_VALUE_RANGE
    assert torch.equal(item.image_grid_thw, grid["image_grid_thw"])
    with pytest.raises(AttributeError):
        _ = item.no_such_field


def test_pad_input_ids_gives_each_image_its_own_value():
    ids, offsets = expand_image_tokens([1, IMG, 2, IMG, 3], IMG, [3, 2], "<image>")
    assert ids == [1, IMG, IMG, IMG, 2, IMG, IMG, 3]
    assert offsets == [(1, 4), (5, 7)]
    items = [
        MultimodalDataItem(Modality.IMAGE, feature=torch.full((1,), float(k)), offsets=[span])
        for k, span in enumerate(offsets)
    ]
    mm = MultimodalInputs.from_dict({"mm_items": items, "im_token_id": IMG})
    p0, p1 = (item.pad_value for item in mm.mm_items)
    assert p0 != p1
    padded = MultiModalityDataPaddingPatternMultimodalTokens().pad_input_tokens(ids, mm)
    assert padded == [1, p0, p0, p0, 2, p1, p1, 3]
    assert [item.num_tokens() for item in mm.mm_items] == [3, 2]
    mm.mm_items[1].offsets = [(4, 6)]  # covers a text token
    with pytest.raises(ValueError, match="not all image tokens"):
        MultiModalityDataPaddingPatternMultimodalTokens().pad_input_tokens(ids, mm)


def test_expand_refuses_a_prompt_whose_image_tokens_do_not_match():
    with pytest.raises(ValueError, match="1 image tokens .* for 2 images"):
        expand_image_tokens([1, IMG, 2], IMG, [4, 4], "<image>")


def test_load_image_forms_and_refusals(tmp_path):
    png = _png(8, 6)
    path = tmp_path / "a.png"
    path.write_bytes(png)
    b64 = base64.b64encode(png).decode()
    for form in (str(path), b64, "data:image/png;base64," + b64, png):
        image = load_image(form, LIMITS)
        assert image.size == (8, 6) and image.mode == "RGB"
    (tmp_path / "t.png").write_text("not an image")
    cases = {
        str(tmp_path / "missing.png"): "does not exist",
        str(tmp_path / "t.png"): "not a readable image",
        "@@not base64@@": "not a file path",
        "data:image/png,raw": "must be base64",
        base64.b64encode(_png(65, 64)).decode(): "at most 4096 pixels",
        base64.b64encode(b"\0" * 20_000).decode(): "at most 10000 allowed",
    }
    for data, message in cases.items():
        with pytest.raises(ValueError, match=message):
            load_image(data, LIMITS)
    with pytest.raises(ValueError, match="non-empty strings"):
        load_image(3, LIMITS)


def test_processor_chat_template(tmp_path):
    assert processor_chat_template(str(tmp_path)) is None
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert processor_chat_template(str(tmp_path)) == "{{ x }}"
