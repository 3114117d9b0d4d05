"""FP8 weight quality against the unquantized model: greedy top-1 agreement and mean KL
divergence of the next-token distributions over every position of a few fixed passages.

Both models run in-process (one Scheduler each, the serving code path) on the same
prompts; each prompt's logits at every position come from one prefill. Usage:

    python benchmarks/fp8_quality.py MODEL_PATH [--device cpu|cuda] [--dtype auto]
        [--quantization fp8|none] [--kv-cache-dtype auto|fp8_e4m3|fp8_e5m2]
        [--decode-from N] [--result-filename out.jsonl]

`--quantization` is what the quantized arm passes (fp8 quantizes a bf16/fp16 checkpoint
online); for an FP8 checkpoint, pass its path as --quantized-path and the unquantized
original as MODEL_PATH. `--kv-cache-dtype` is the quantized arm's KV pool (the reference
keeps the model dtype): each position's attention reads its prompt's keys and values back
from the pool, so an FP8 pool's rounding reaches every logit but the first. A prefill reads
the pool with the prefill kernel; `--decode-from N` runs positions N - 1 on as teacher-forced
decode steps instead (decode_logits), through the decode kernel generation uses (XQA for an
e4m3 pool on Hopper, where it is the default). Prints one JSON line: positions, top1_agreement (fraction of
positions whose argmax matches), mean_kl (nats, KL(reference || quantized)), max_kl.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

PASSAGES = [
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Books, "
    "which had been copied by hand for centuries, could now be produced in hundreds of "
    "identical copies, and the price of knowledge fell sharply. Within fifty years presses "
    "were running in more than two hundred European cities, and pamphlets, calendars and "
    "scientific treatises spread ideas faster than any government could control them.",
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n    middle = "
    "len(items) // 2\n    left = merge_sort(items[:middle])\n    right = merge_sort(items["
    "middle:])\n    merged = []\n    while left and right:\n        if left[0] <= right[0]:\n"
    "            merged.append(left.pop(0))\n        else:\n            merged.append(right."
    "pop(0))\n    return merged + left + right\n",
    "Photosynthesis converts light energy into chemical energy. In the light-dependent "
    "reactions, chlorophyll absorbs photons and splits water, releasing oxygen and producing "
    "ATP and NADPH. The Calvin cycle then uses these molecules to fix carbon dioxide into "
    "sugars. Plants, algae and cyanobacteria all depend on this process, and so, indirectly, "
    "does nearly every other living thing on Earth.",
    "User: What is the capital of Australia, and why was it chosen?\nAssistant: The "
    "capital of Australia is Canberra. It was chosen in 1908 as a compromise between "
    "Sydney and Melbourne, the two largest cities, which both wanted the title. The city "
    "was purpose-built and designed by the American architects Walter Burley Griffin and "
    "Marion Mahony Griffin.",
]


def _prefill_batch(scheduler, rid: str, ids: list[int], **req_kw):
    """(req, batch): one greedy request for `ids`, its extend batch prepared (KV slots
    allocated) on the scheduler's pools."""
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import ScheduleBatch
    from mini_sglang.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=1, temperature=0.0)
    sp.normalize(None)
    vocab = scheduler.model_config.vocab_size
    req = Req(rid, "", ids, sp, vocab_size=vocab, **req_kw)
    req.init_next_round_input(None)
    pools = (scheduler.req_to_token_pool, scheduler.allocator, scheduler.tree_cache)
    batch = ScheduleBatch([req], *pools, vocab, scheduler.device)
    batch.prepare_for_extend()
    return req, batch


def _release(scheduler, req, kv_len: int) -> None:
    """Free the request's KV slots (positions 0 .. kv_len - 1) and its request slot."""
    table = scheduler.req_to_token_pool.req_to_token
    scheduler.allocator.free(table[req.req_pool_idx, :kv_len].to(torch.int64))
    scheduler.req_to_token_pool.free(req.req_pool_idx)


def position_logits(scheduler, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Float32 logits [len(p), vocab] at every position of each prompt (one prefill each)."""
    out = []
    for i, ids in enumerate(prompts):
        req, batch = _prefill_batch(
            scheduler, f"q{i}", ids, return_logprob=True, logprob_start_len=0
        )
        result = scheduler.tp_worker.forward_batch_generation(batch.get_model_worker_batch())
        _release(scheduler, req, len(ids))
        out.append(result.logits_output.input_logits[: len(ids)].float().cpu())
    return out


def decode_logits(scheduler, prompts: list[list[int]], prefill: int) -> list[torch.Tensor]:
    """Float32 logits [len(p) - prefill + 1, vocab] at positions prefill - 1 .. len(p) - 1 of
    each prompt: the first from a prefill of p[:prefill], every later one from a decode step
    fed the prompt's next token (teacher forcing), so those positions run the decode
    attention kernel over the KV pool, as generation does (an FP8 pool on Hopper: XQA)."""
    out = []
    for i, ids in enumerate(prompts):
        req, batch = _prefill_batch(scheduler, f"d{i}", ids[:prefill])
        rows = []
        for t in range(prefill, len(ids) + 1):
            result = scheduler.tp_worker.forward_batch_generation(batch.get_model_worker_batch())
            rows.append(result.logits_output.next_token_logits[0].float().cpu())
            if t == len(ids):
                break
            batch.output_ids = torch.tensor([ids[t]], dtype=torch.int64, device=scheduler.device)
            batch.prepare_for_decode()
        _release(scheduler, req, len(ids))
        out.append(torch.stack(rows))
    return out


def make_scheduler(
    model_path: str, device: str, dtype: str, quantization: str | None, kv: str = "auto"
):
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(
        model_path=model_path,
        device=device,
        dtype=dtype,
        quantization=quantization,
        kv_cache_dtype=kv,
        max_total_tokens=4096,
        max_running_requests=8,
        disable_radix_cache=True,
        disable_cuda_graph=True,
        random_seed=0,
    )
    return Scheduler(args, send_to_detokenizer=lambda _: None)


def compare(ref: list[torch.Tensor], got: list[torch.Tensor]) -> dict:
    """top1_agreement, mean_kl and max_kl (nats) over every position."""
    r, g = torch.cat(ref).double(), torch.cat(got).double()
    log_p, log_q = r.log_softmax(-1), g.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return {
        "positions": r.shape[0],
        "top1_agreement": (r.argmax(-1) == g.argmax(-1)).double().mean().item(),
        "mean_kl": kl.mean().item(),
        "max_kl": kl.max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path")
    parser.add_argument("--quantized-path", default=None, help="default: MODEL_PATH")
    parser.add_argument("--quantization", default="fp8", help="'none' for an FP8 checkpoint")
    parser.add_argument("--kv-cache-dtype", default="auto", help="the quantized arm's KV pool")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--decode-from",
        type=int,
        default=0,
        help="N > 0: positions from N - 1 on come from teacher-forced decode steps (both "
        "arms), so an FP8 KV arm is read by the decode kernel (XQA on Hopper) as in "
        "generation; 0: every position from one prefill",
    )
    parser.add_argument("--result-filename", default=None)
    args = parser.parse_args()
    quantization = None if args.quantization == "none" else args.quantization
    t0 = time.perf_counter()
    ref_sched = make_scheduler(args.model_path, args.device, args.dtype, None)
    prompts = [ref_sched.tokenizer.encode(p) for p in PASSAGES]

    def logits(sched) -> list[torch.Tensor]:
        if args.decode_from > 0:
            return decode_logits(sched, prompts, args.decode_from)
        return position_logits(sched, prompts)

    ref = logits(ref_sched)
    del ref_sched
    quant_path = args.quantized_path or args.model_path
    quant_sched = make_scheduler(
        quant_path, args.device, args.dtype, quantization, args.kv_cache_dtype
    )
    got = logits(quant_sched)
    result = {
        "model_path": args.model_path,
        "quantized_path": quant_path,
        "quantization": quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "page_size": quant_sched.page_size,
        "decode_from": args.decode_from,
        "device": args.device,
        "dtype": args.dtype,
        **compare(ref, got),
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result))
    if args.result_filename:
        with open(args.result_filename, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
