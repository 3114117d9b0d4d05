"""LogitsProcessor: hidden states -> next-token logits (and prompt-position logits on demand).

For EXTEND only each request's last position feeds the sampler; requests that asked for
prompt logprobs also get the logits of their prompt positions from `extend_logprob_start_len`.
Logits are computed in float32 and cut to the real vocab (the padded rows of a TP-sharded
LM head are dropped after the all-gather).

Worked example: extend_seq_lens [2, 4] -> flat positions 0..5, last positions [1, 5].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.distributed.parallel_state import tensor_model_parallel_all_gather
from mini_sglang.layers.small_m_gemm import linear

if TYPE_CHECKING:
    from mini_sglang.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [batch, vocab] float32
    # Logits of the prompt positions whose logprobs were requested, all requests
    # concatenated in batch order ([sum of pruned lens, vocab]); None when nobody asked.
    input_logits: torch.Tensor | None = None
    input_logits_lens: list[int] | None = None


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def _logits(self, hidden: torch.Tensor, lm_head: VocabParallelEmbedding) -> torch.Tensor:
        logits = linear(hidden.to(lm_head.weight.dtype), lm_head.weight)
        logits = tensor_model_parallel_all_gather(logits)
        return logits[:, : self.vocab_size].float()

    def forward(
        self, hidden: torch.Tensor, lm_head: VocabParallelEmbedding, fb: ForwardBatch
    ) -> LogitsProcessorOutput:
        if fb.forward_mode.is_decode():
            return LogitsProcessorOutput(self._logits(hidden, lm_head))
        last = fb.extend_start_loc + fb.extend_seq_lens - 1
        if not fb.return_logprob or not any(
            s < e for s, e in zip(fb.extend_logprob_start_lens or [], fb.extend_seq_lens_cpu)
        ):
            return LogitsProcessorOutput(self._logits(hidden[last.long()], lm_head))
        # Prompt logprobs requested: compute logits of the requested prompt positions too.
        # Request i contributes positions [start_i + s_i, start_i + ext_i), s_i being its
        # extend_logprob_start_len (relative to this chunk); its last one is the sampling row.
        rows, lens, offset = [], [], 0
        for s, ext in zip(fb.extend_logprob_start_lens, fb.extend_seq_lens_cpu):
            s = min(max(s, 0), ext)
            rows.append(torch.arange(offset + s, offset + ext))
            lens.append(ext - s)
            offset += ext
        idx = torch.cat(rows).to(hidden.device)
        logits = self._logits(hidden[idx], lm_head)
        next_rows = torch.tensor(lens).cumsum(0) - 1
        has_rows = torch.tensor(lens) > 0
        next_logits = self._logits(hidden[last.long()], lm_head)
        # Reuse the rows already computed where a request's last position was included.
        if bool(has_rows.all()):
            next_logits = logits[next_rows.to(logits.device)]
        return LogitsProcessorOutput(next_logits, logits, lens)
