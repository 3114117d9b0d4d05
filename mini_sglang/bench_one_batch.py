"""Latency of one static batch: prefill, then decode step by step (SGLang's bench_one_batch).

    python -m mini_sglang.bench_one_batch --model-path DIR [--load-format dummy] \\
        --batch-size 1 --input-len 128 --output-len 1024

It drives the real ScheduleBatch -> ModelRunner path (KV allocation, CUDA graphs, sampling)
without the scheduler process, and reports prefill latency, decode ms/token and, on CUDA,
the forward occupancy: the share of decode wall time the GPU spends inside the forward.
With --tp-size N it starts one process per TP rank (GPUs base_gpu_id + rank * gpu_id_step),
each running the same batches in lockstep; rank 0 reports, as in SGLang.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import sys
import time

import torch

from mini_sglang.benchmark.tp_group import run_tp_group
from mini_sglang.distributed.parallel_state import get_tp_size
from mini_sglang.layers.kernels import wait_flashinfer_builds
from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
from mini_sglang.managers.req import Req
from mini_sglang.managers.schedule_batch import ScheduleBatch
from mini_sglang.managers.scheduler import Scheduler
from mini_sglang.managers.tp_worker import ForwardTimer, TpModelWorker
from mini_sglang.mem_cache.chunk_cache import ChunkCache
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.server_args import ServerArgs
from mini_sglang.utils.sync_debug import find_syncs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prefill_groups(reqs: list[Req], max_tokens: int) -> list[list[Req]]:
    """Consecutive groups of requests whose prompts sum to at most max_tokens (a longer
    prompt gets a group of its own), so a large batch never prefills in one huge forward.

    Example: prompts of 6000 tokens, max_tokens 16384 -> groups of 2, 2, 2, ... requests."""
    groups: list[list[Req]] = [[]]
    used = 0
    for r in reqs:
        n = len(r.origin_input_ids)
        if groups[-1] and used + n > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(r)
        used += n
    return groups


def run_once(
    worker: TpModelWorker,
    bs: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    on_decode_start=None,
):
    """Prefill a batch of random prompts (in groups of at most --max-prefill-tokens), then
    decode it step by step. Returns (prefill seconds, per-step decode seconds, GPU seconds
    inside the decode forwards or None). `on_decode_start()` is called between the two."""
    runner = worker.model_runner
    vocab = worker.model_config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    reqs = []
    for i in range(bs):
        ids = torch.randint(0, vocab, (input_len,), generator=gen).tolist()
        sp = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True)
        r = Req(str(i), "", ids, sp, vocab_size=vocab)
        r.init_next_round_input(None)
        reqs.append(r)
    cache = ChunkCache(
        runner.req_to_token_pool, runner.token_to_kv_pool_allocator, runner.page_size
    )
    dev = runner.device
    _sync(dev)
    t0 = time.perf_counter()
    batch = None
    for group in _prefill_groups(reqs, worker.server_args.max_prefill_tokens):
        part = ScheduleBatch(
            group,
            runner.req_to_token_pool,
            runner.token_to_kv_pool_allocator,
            cache,
            vocab,
            dev,
        )
        part.prepare_for_extend()
        res = worker.forward_batch_generation(part.get_model_worker_batch())
        part.output_ids = res.next_token_ids
        if batch is None:
            batch = part
        else:
            batch.merge_batch(part)
    _sync(dev)
    prefill = time.perf_counter() - t0
    if on_decode_start is not None:
        on_decode_start()
    decode_lat, gpu_ms = [], []
    for _ in range(output_len - 1):
        start_ev = end_ev = None
        if dev.type == "cuda":
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        batch.prepare_for_decode()
        if start_ev is not None:
            start_ev.record()
        res = worker.forward_batch_generation(batch.get_model_worker_batch())
        if end_ev is not None:
            end_ev.record()
        batch.output_ids = res.next_token_ids
        res.next_token_ids.tolist()  # the host needs the tokens each step, as the scheduler does
        decode_lat.append(time.perf_counter() - t)
        if end_ev is not None:
            gpu_ms.append((start_ev, end_ev))
    # Free everything for the next run.
    for i, r in enumerate(reqs):
        r.output_ids = [0] * (int(batch.seq_lens[i]) - input_len + 1)
        cache.cache_finished_req(r)
    _sync(dev)
    forward_s = sum(s.elapsed_time(e) for s, e in gpu_ms) / 1000 if gpu_ms else None
    return prefill, decode_lat, forward_s


def run_scheduler(
    scheduler, outputs: list, bs: int, input_len: int, output_len: int, seed: int = 0
):
    """The same batch through an in-process Scheduler (its loop, overlap and streaming
    included; `outputs` is the list its send_to_detokenizer appends to): (time to first
    token, per-token decode seconds)."""
    vocab = scheduler.model_config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    sent = len(outputs)
    t0 = time.perf_counter()
    for i in range(bs):
        ids = torch.randint(0, vocab, (input_len,), generator=gen).tolist()
        sp = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True)
        sp.normalize(None)
        scheduler.add_request(TokenizedGenerateReqInput(f"s{seed}-{i}", "", ids, sp, stream=True))
    first = None
    while scheduler.run_step() or scheduler.has_work():
        if first is None and len(outputs) > sent:
            first = time.perf_counter()
    total = time.perf_counter() - t0
    ttft = (first or t0) - t0
    return ttft, (total - ttft) / max(output_len - 1, 1)


def profile_decode(worker: TpModelWorker, bs: int, input_len: int, path: str | None) -> None:
    """Kernel-level profile of 20 decode steps (the prefill runs before it starts), written
    to path unless it is None (TP ranks other than 0 run the steps and write nothing), with
    the kernel timeline as a Chrome trace at path + ".trace.json"."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    run_once(worker, bs, input_len, 21, on_decode_start=prof.start)
    prof.stop()
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
    if path is None:
        return
    prof.export_chrome_trace(path + ".trace.json")
    with open(path, "w") as f:
        f.write(table)
        f.write("\n\n")
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    print(table)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1])
    parser.add_argument("--input-len", type=int, nargs="+", default=[1024])
    parser.add_argument("--output-len", type=int, nargs="+", default=[16])
    parser.add_argument("--result-filename", type=str, default=None)
    parser.add_argument(
        "--mode",
        choices=["runner", "scheduler"],
        default="runner",
        help="runner: ScheduleBatch + ModelRunner only (SGLang's bench_one_batch); "
        "scheduler: an in-process Scheduler with its real loop (overlap, streaming)",
    )
    parser.add_argument(
        "--profile",
        type=str,
        default=None,
        help="write a torch.profiler kernel table of 20 decode steps to this file",
    )
    parser.add_argument(
        "--sync-debug",
        action="store_true",
        help="scheduler mode, CUDA: list the host<->device syncs of one run by call site",
    )
    args = parser.parse_args(argv)
    server_args = ServerArgs.from_cli_args(args)
    if server_args.dp_size > 1 or server_args.nnodes > 1:
        parser.error(
            "bench_one_batch runs one TP group on this machine: use --dp-size 1 --nnodes 1"
        )
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper()))
    if server_args.tp_size > 1:
        return run_tp_group(_run_rank, server_args, args)
    return _run_rank(server_args, args, 0)


def _run_rank(server_args: ServerArgs, args, tp_rank: int) -> dict:
    """The benchmark on one rank (the TP group, if any, already joined); only rank 0 prints
    and writes the result file."""
    gpu_id = server_args.base_gpu_id + tp_rank * server_args.gpu_id_step
    if tp_rank > 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (this rank's process ends with the run)
    if args.mode == "scheduler":
        return {"results": _main_scheduler(server_args, args, gpu_id, tp_rank)}
    worker = TpModelWorker(server_args, gpu_id=gpu_id)
    results = []
    wait_flashinfer_builds()
    run_once(worker, 1, 16, 4)  # warm-up
    for bs in args.batch_size:
        for il in args.input_len:
            for ol in args.output_len:
                prefill, dec, forward_s = run_once(worker, bs, il, ol)
                med = statistics.median(dec)
                total_decode = sum(dec)
                occupancy = forward_s / total_decode if forward_s else None
                print(
                    f"Prefill. latency: {prefill:.5f} s, throughput: {bs * il / prefill:9.2f} token/s"
                )
                print(
                    f"Decode.  median latency: {med:.5f} s, median throughput: {bs / med:9.2f} token/s"
                )
                print(f"Decode.  mean ms/token (per step): {1000 * total_decode / len(dec):.4f}")
                if occupancy is not None:
                    print(f"Decode.  forward occupancy: {100 * occupancy:.2f}%")
                total = prefill + total_decode
                print(
                    f"Total. latency: {total:.3f} s, throughput: {bs * (il + ol) / total:9.2f} token/s"
                )
                results.append(
                    {
                        "batch_size": bs,
                        "input_len": il,
                        "output_len": ol,
                        "prefill_latency": prefill,
                        "median_decode_latency": med,
                        "mean_decode_ms": 1000 * total_decode / len(dec),
                        "forward_occupancy": occupancy,
                        "device": str(worker.device),
                        "tp_size": get_tp_size(),
                        "model_path": server_args.model_path,
                        "attention_backend": server_args.attention_backend,
                        "cuda_graph": not server_args.disable_cuda_graph,
                    }
                )
    if args.profile:
        path = args.profile if tp_rank == 0 else None
        profile_decode(worker, args.batch_size[0], args.input_len[0], path)
    if args.result_filename and tp_rank == 0:
        with open(args.result_filename, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return {"results": results, "server_args": dataclasses.asdict(server_args)}


def _main_scheduler(server_args: ServerArgs, args, gpu_id: int, tp_rank: int) -> list[dict]:
    outputs: list = []
    # Every rank gets the same requests straight into its Scheduler (a server's rank 0
    # broadcasts them instead), so the ranks' loops take the same steps.
    scheduler = Scheduler(
        server_args, gpu_id=gpu_id, tp_rank=tp_rank, send_to_detokenizer=outputs.append
    )
    worker = scheduler.tp_worker
    wait_flashinfer_builds()
    run_scheduler(scheduler, outputs, 1, 16, 8, seed=99)  # warm-up
    if args.sync_debug and worker.device.type != "cuda":
        print("--sync-debug needs a CUDA device (torch's sync debug mode); skipped")
    elif args.sync_debug:
        bs, il, ol = args.batch_size[0], args.input_len[0], args.output_len[0]
        sites = find_syncs(lambda: run_scheduler(scheduler, outputs, bs, il, ol, 5))
        print(f"Host-device syncs in {ol} steps at bs={bs}: {sum(sites.values())}")
        for site, n in sites.most_common():
            print(f"  {n:6d}  {site}")
    if args.profile and tp_rank == 0:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run_scheduler(
            scheduler, outputs, args.batch_size[0], args.input_len[0], args.output_len[0], 7
        )
        prof.disable()
        with open(args.profile, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(45)
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(45)
    results = []
    for bs in args.batch_size:
        for il in args.input_len:
            for ol in args.output_len:
                timed = worker.device.type == "cuda"
                worker.forward_timer = ForwardTimer() if timed else None
                ttft, per_token = run_scheduler(scheduler, outputs, bs, il, ol)
                occupancy = worker.forward_timer.decode_occupancy() if timed else None
                worker.forward_timer = None
                print(
                    f"Scheduler. bs={bs} in={il} out={ol} overlap={scheduler.overlap}: "
                    f"TTFT {1000 * ttft:.2f} ms, decode {1000 * per_token:.4f} ms/token"
                    + (f", forward occupancy {100 * occupancy:.2f}%" if occupancy else "")
                )
                results.append(
                    {
                        "mode": "scheduler",
                        "batch_size": bs,
                        "input_len": il,
                        "output_len": ol,
                        "ttft_ms": 1000 * ttft,
                        "decode_ms_per_token": 1000 * per_token,
                        "forward_occupancy": occupancy,
                        "overlap": scheduler.overlap,
                        "tp_size": get_tp_size(),
                        "model_path": server_args.model_path,
                        "device": str(scheduler.device),
                    }
                )
    if args.result_filename and tp_rank == 0:
        with open(args.result_filename, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return results


if __name__ == "__main__":
    main()
