"""CPU decode throughput: mini-sglang's in-process Scheduler beside transformers' `generate`.

Both run the embedded default model (SmolLM2-135M-Instruct, the converted float32
directory) in the same process on the same weights, greedy, ignore_eos, with fixed-length
random prompts. Reported per batch size:

  decode tok/s  tokens produced by decode steps / time spent in decode steps
                (prefill and the first token excluded)
  e2e tok/s     all output tokens / wall time of the whole batch (prefill included)

Usage:
  python benchmarks/bench_cpu_decode.py [--batch-sizes 1 16] [--input-len 32]
      [--output-len 64] [--threads N] [--skip-hf]
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass

import torch


@dataclass
class Result:
    decode_tok_s: float
    e2e_tok_s: float
    prefill_s: float


def make_prompts(
    batch_size: int, input_len: int, vocab_size: int, seed: int = 0
) -> list[list[int]]:
    """Fixed-length random token prompts (same for both engines); ids avoid the special
    tokens at the start of the SmolLM2 vocab."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab_size - 100, (batch_size, input_len), generator=gen).tolist()


def bench_mini_sglang(scheduler, prompts: list[list[int]], output_len: int) -> Result:
    """Run the prompts as one batch through the Scheduler, timing each step by the mode of
    the batch it launched (run_step: overlap scheduling unless --disable-overlap-schedule;
    on CPU the forward is synchronous, so a step's time is its own forward plus the
    processing of the previous step's tokens)."""
    from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
    from mini_sglang.sampling.sampling_params import SamplingParams

    scheduler.flush_cache()  # no prefix hits from an earlier round
    for i, ids in enumerate(prompts):
        sp = SamplingParams(max_new_tokens=output_len, temperature=0.0, ignore_eos=True)
        sp.normalize(None)
        scheduler.add_request(
            TokenizedGenerateReqInput(rid=f"b{i}", input_text="", input_ids=ids, sampling_params=sp)
        )
    step = getattr(scheduler, "run_step", scheduler.step)
    decode_s = prefill_s = 0.0
    decode_tokens = 0
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        ran = step()
        dt = time.perf_counter() - t0
        if not ran:
            if not scheduler.has_work():
                break
            continue
        batch = scheduler.cur_batch
        if batch.forward_mode.is_decode():
            decode_s += dt
            decode_tokens += len(batch.reqs)
        else:
            prefill_s += dt
    total_s = time.perf_counter() - t_start
    # Overlap launches one surplus decode step after the last token (its output is dropped).
    assert decode_tokens >= len(prompts) * (output_len - 1), decode_tokens
    decode_tokens = len(prompts) * (output_len - 1)
    return Result(decode_tokens / decode_s, len(prompts) * output_len / total_s, prefill_s)


class _TimingStreamer:
    """A transformers streamer that only records when each generate step's tokens appear
    (the first `put` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@torch.no_grad()
def bench_hf(model, prompts: list[list[int]], output_len: int) -> Result:
    """transformers' greedy generate on the same batch (equal lengths: no padding)."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        max_new_tokens=output_len, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    ids = torch.tensor(prompts)
    streamer = _TimingStreamer()
    t_start = time.perf_counter()
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), generation_config=cfg, streamer=streamer
    )
    total_s = time.perf_counter() - t_start
    assert out.shape[1] == ids.shape[1] + output_len
    # times[0]: prompt, times[1]: first token (after prefill), times[-1]: last token.
    prefill_s = streamer.times[1] - t_start
    decode_s = streamer.times[-1] - streamer.times[1]
    bs = len(prompts)
    return Result(bs * (output_len - 1) / decode_s, bs * output_len / total_s, prefill_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--skip-hf", action="store_true", help="only benchmark mini-sglang")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)

    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.model_loader.default_model import resolve_default_model_path
    from mini_sglang.server_args import ServerArgs

    path = resolve_default_model_path()
    max_bs = max(args.batch_sizes)
    server_args = ServerArgs(
        model_path=path,
        device="cpu",
        max_total_tokens=max_bs * (args.input_len + args.output_len) + 256,
        max_running_requests=max_bs,
        random_seed=0,
        skip_tokenizer_init=True,
    )
    scheduler = Scheduler(server_args)
    hf_model = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = scheduler.model_config.vocab_size

    # Warm-up (first-call allocations, kernel selection) on a small batch.
    warm = make_prompts(2, args.input_len, vocab, seed=99)
    bench_mini_sglang(scheduler, warm, 4)
    if hf_model is not None:
        bench_hf(hf_model, warm, 4)

    print(
        f"SmolLM2-135M-Instruct float32, CPU, {torch.get_num_threads()} threads, "
        f"input {args.input_len} tokens, output {args.output_len} tokens, greedy, ignore_eos"
    )
    header = f"{'engine':<14}{'batch':>6}{'decode tok/s':>14}{'e2e tok/s':>12}{'prefill s':>11}"
    print(header)
    print("-" * len(header))
    for bs in args.batch_sizes:
        prompts = make_prompts(bs, args.input_len, vocab)
        rows = [("mini-sglang", bench_mini_sglang(scheduler, prompts, args.output_len))]
        if hf_model is not None:
            rows.append(("transformers", bench_hf(hf_model, prompts, args.output_len)))
        for name, r in rows:
            print(
                f"{name:<14}{bs:>6}{r.decode_tok_s:>14.1f}{r.e2e_tok_s:>12.1f}{r.prefill_s:>11.3f}"
            )


if __name__ == "__main__":
    main()
