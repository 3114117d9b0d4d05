"""M-RoPE positions of a prompt (Qwen2-VL / Qwen2.5-VL), computed once per request by the
processor and carried in MultimodalInputs.mrope_positions / mrope_position_delta.

The model reads them per extend chunk (models/qwen2_5_vl.py mrope_extend_positions) and the
scheduler shifts decode positions by the delta (ScheduleBatch.prepare_for_decode).
"""

from __future__ import annotations

import torch


def get_rope_index(
    input_ids: list[int] | torch.Tensor,
    image_token_id: int,
    image_grid_thw: torch.Tensor | list,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, int]:
    """(mrope_positions int64 [3, len(input_ids)], mrope_position_delta) of one prompt whose
    images are already expanded to their t * h * w / merge**2 image tokens (transformers'
    Qwen2_5_VLModel.get_rope_index for still images).

    Text tokens count on from the previous token on all three rows. An image at text
    position s gets (s + t_i, s + h_i, s + w_i) over its merged grid, row-major; the text
    after it starts at s + max(t, h / merge, w / merge). The delta is max position + 1 -
    length: a generated token at sequence position p has all three positions p + delta.

    Worked example (merge 2, one image with grid (1, 4, 6) -> 1 x 2 x 3 = 6 tokens between
    2 text tokens before and 1 after): rows t = [0 1 | 2 2 2 2 2 2 | 5], h = [0 1 | 2 2 2 3 3
    3 | 5], w = [0 1 | 2 3 4 2 3 4 | 5]; delta = 6 - 9 = -3.
    """
    ids = torch.as_tensor(input_ids, dtype=torch.int64).reshape(-1)
    grids = torch.as_tensor(image_grid_thw, dtype=torch.int64).reshape(-1, 3).tolist()
    image_at = (ids == image_token_id).nonzero().flatten().tolist()
    pieces: list[torch.Tensor] = []
    cursor, next_pos, k = 0, 0, 0
    for t, h, w in grids:
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        n = t * gh * gw
        while k < len(image_at) and image_at[k] < cursor:
            k += 1
        if k >= len(image_at):
            raise ValueError("fewer image tokens in the prompt than images")
        start = image_at[k]
        if start > cursor:
            pieces.append(torch.arange(next_pos, next_pos + start - cursor).expand(3, -1))
            next_pos += start - cursor
        if start + n > len(ids) or not bool((ids[start : start + n] == image_token_id).all()):
            raise ValueError(f"an image with grid {(t, h, w)} needs {n} image tokens in a row")
        grid = torch.stack(
            torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        ).reshape(3, -1)
        pieces.append(grid + next_pos)
        next_pos += max(t, gh, gw)
        cursor = start + n
    if (ids[cursor:] == image_token_id).any():
        raise ValueError("more image tokens in the prompt than the images account for")
    if cursor < len(ids):
        pieces.append(torch.arange(next_pos, next_pos + len(ids) - cursor).expand(3, -1))
        next_pos += len(ids) - cursor
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.int64)
    return positions.contiguous(), next_pos - len(ids)
