"""Small-M GEMV picks and expert GEMV tiles tuned inside the model's CUDA-graph decode step.

small_m_gemm times each shape's candidates alone, weight cold in L2, at start-up. Inside
the decode step a config's neighbours can reverse that order: on an H100, Llama-3.1-8B
`--quantization fp8` ran 3.28 / 4.42 ms a step at batch 1 / 2 with gate_up on a grid config
the standalone timing ranks below the pick, against 3.37 / 4.73 with the pick, and the
profile put part of the difference in the kernels around gate_up
(docs/performance/decode-gemv.md). Each such pick so far came from a hand-run A/B of one
forced config; this script runs that search for every pick of a model:

    python benchmarks/tune_gemv_in_step.py --model-path DIR --load-format dummy \\
        [--quantization fp8] [--tune-batch-size 1 2] [--top 3] [--input-len 512] \\
        [--steps 48] [--threshold 0.005] [--passes 2] [--out picks.json] [--record] \\
        [--ab-dirs BASE TUNED]

After the start-up picks (which capture the CUDA graphs of --tune-batch-size), each pick of
those batch sizes' buckets is tried in turn (coordinate descent): its --top
fastest candidates timed alone (small_m_gemm.time_candidates) and key None (cuBLAS, or an
FP8 layer's own path) are each set as the pick, the graphs captured again and decode steps
timed: the GPU time of --steps forwards (bench_one_batch.run_once's events), a fresh batch
of prompts of --input-len tokens each time. The fastest challenger replaces the pick only
if it wins each of --confirm rounds in which both are timed, the pick first in odd rounds
and second in even ones, by at least --threshold (a fraction of the step) on average. A
step's time drifts over a run (by 4% across one H100 run of
docs/results/gemv_in_step_qwen3_30b_a3b_fp8_block_bs1_h100.log), so each round's two
timings are compared with each other, not with the first timing of the pick taken before
the others were tried; alternating the order cancels a steady drift from the mean. A
candidate may make the step ask for keys it did not ask before (a gate_up whose norm fold
is dropped asks for its SiLU-mul fold's pick): it is timed with each of those keys at its
fastest option, tried in turn under it, and wins or loses together with them; keys a kept
change brings later join the queue. In a mixture-of-experts model whose experts take the
GEMV path at that bucket (MINI_SGLANG_MOE_SMALL_M), the tiles of its two expert kernels
follow, each tried at every tile of bench_fused_moe.py's SWEEP. A pass that changed
something is followed by another, up to --passes: a pick kept early was judged beside the
others' old choices (on an H100, Qwen3-30B-A3B's qkv on cuBLAS won at batch 2 beside the
old expert tiles and lost beside the new ones).

Prints every trial; --out writes the picks that changed as a kernel_choices table (the
form of mini_sglang/layers/kernel_configs/gemv_<card>.json), to ship there once a model
A/B (run_gpu_suite.sh ab, the picks forced per shape) confirms them; --record writes them
into this machine's pick cache instead (kernel_choices.record), so the next start uses
them. Expert tiles that won are printed as a MINI_SGLANG_MOE_GEMV_TILES value for that A/B
and, for the card's table of expert tiles (fused_moe_gemv.CARD_TABLE, keyed by batch bucket,
layer shape and format; shipped as kernel_configs/moe_gemv_<card>.json), written beside --out
(picks.moe_gemv.json) or recorded with --record. --ab-dirs BASE TUNED writes two pick caches
for that A/B (MINI_SGLANG_CACHE_DIR=BASE against =TUNED): both this run's cache (the picks
it started from), TUNED with the changes written over them, so the arms differ in those
alone (`GEMV_IN_STEP_AB` in run_gpu_suite.sh runs the A/B in the same call). One GPU,
--tp-size 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

Choice = tuple | None


@dataclass
class Outcome:
    """What descend decided for one key: the pick it started from, the one it kept, and every
    timing it took (choice, ms) in order."""

    key: Hashable
    start: Choice
    kept: Choice
    trials: list[tuple[Choice, float]] = field(default_factory=list)


def descend(
    queue: list[Hashable],
    current: Callable[[Hashable], Choice],
    options: Callable[[Hashable], Iterable[Choice]],
    apply: Callable[[Hashable, Choice], None],
    measure: Callable[[], float],
    new_keys: Callable[[], Iterable[Hashable]] = lambda: (),
    threshold: float = 0.005,
    confirm: int = 3,
    report: Callable[[str], None] = print,
) -> list[Outcome]:
    """One pass of coordinate descent over the keys in `queue`, which grows by the keys
    new_keys() returns that no earlier key had (each checked after a key is decided).

    For each key: measure() with its current choice, then with each other option applied
    (apply(key, choice) sets it; measure() returns ms, lower is better). An option under
    which the step asks for keys it did not ask before (new_keys() after its measure) is
    timed together with those keys' fastest options, each key tried in turn with the
    option applied: dropping gate_up's norm fold runs the SiLU-mul variant's pick, and the
    drop may win only with that pick changed too. The fastest challenger (with its keys'
    picks) is confirmed in `confirm` rounds of one measurement each, the current choice
    first in odd rounds and the challenger first in even ones (see _confirmed); otherwise
    the current choices are applied back. Returns one Outcome per key decided, in order (a
    kept challenger's keys right after it, decided with it)."""
    step = _Search(current, options, apply, measure, report)
    outcomes: list[Outcome] = []
    seen = set(queue)

    def fresh() -> list[Hashable]:
        return [k for k in new_keys() if k not in seen]

    i = 0
    while i < len(queue):
        out, brought = _decide(step, queue[i], fresh, threshold, confirm)
        i += 1
        outcomes += [out, *brought]
        seen.update(o.key for o in brought)  # tried under the kept choice already
        for k in fresh():
            seen.add(k)
            queue.append(k)
    return outcomes


@dataclass
class _Search:
    """descend's view of the step (see its arguments)."""

    current: Callable[[Hashable], Choice]
    options: Callable[[Hashable], Iterable[Choice]]
    apply: Callable[[Hashable, Choice], None]
    measure: Callable[[], float]
    report: Callable[[str], None]

    def set(self, key: Hashable, choice: Choice, brought: list[Outcome], kept: bool) -> None:
        """Apply `choice` to key, and to the keys it brought their kept (or start) picks."""
        for o in brought:
            self.apply(o.key, o.kept if kept else o.start)
        self.apply(key, choice)


def _decide(
    step: _Search,
    key: Hashable,
    fresh: Callable[[], list[Hashable]],
    threshold: float,
    confirm: int,
) -> tuple[Outcome, list[Outcome]]:
    """descend's decision for one key: its Outcome, and those of the keys a kept challenger
    brought into the step ([] where the current choice stays)."""
    start = step.current(key)
    out = Outcome(key, start, start)
    first = step.measure()
    out.trials.append((start, first))
    best, best_ms, brought = start, first, []
    for choice in step.options(key):
        if choice == start:
            continue
        step.apply(key, choice)
        ms = step.measure()
        out.trials.append((choice, ms))
        step.report(f"{key}: {choice} {ms:.4f} ms (current {start}: {first:.4f})")
        new = [Outcome(k, step.current(k), step.current(k)) for k in fresh()]
        for o in new:
            ms = _follow(step, o, ms, f"{key}={choice}")
        if ms < best_ms:
            best, best_ms, brought = choice, ms, new
        step.set(key, start, new, kept=False)
    if best == start:
        return out, []
    base, challenger = [], []
    for r in range(confirm):
        for is_challenger in (r % 2 == 1, r % 2 == 0):
            choice = best if is_challenger else start
            step.set(key, choice, brought, kept=is_challenger)
            ms = step.measure()
            (challenger if is_challenger else base).append(ms)
            out.trials.append((choice, ms))
    kept = _confirmed(base, challenger, threshold)
    step.report(
        f"{key}: {'kept' if kept else 'not kept'} {best}"
        + "".join(f", {o.key}: {o.kept}" for o in brought)
        + f": {', '.join(f'{t:.4f}' for t in challenger)} ms against {start}: "
        + ", ".join(f"{t:.4f}" for t in base)
    )
    step.set(key, best if kept else start, brought, kept=kept)
    if not kept:
        return out, []
    out.kept = best
    return out, brought


def _confirmed(base: list[float], challenger: list[float], threshold: float) -> bool:
    """Whether the challenger won: faster than the current choice in every round (base[i]
    and challenger[i] timed one after the other) and by threshold x the current mean on
    average. The scan's timings stay out: the challenger's is the fastest of several (its
    luck selected it) and the current one's is the run's oldest.

    Example, a steady drift of +0.01 ms a measurement and a challenger 0.06 ms faster, in
    three rounds (current first, then challenger first, then current first): base 3.12,
    3.15, 3.16 against challenger 3.07, 3.08, 3.11 wins every round (gain 0.057 ms), where
    asking every challenger time to beat every current time, the current's scan time 3.10
    among them, would reject it. With equal costs the second round's order leaves the
    challenger slower (b - c = -0.01) and it is not kept."""
    if not base:
        return False
    wins = all(c < b for b, c in zip(base, challenger, strict=True))
    gain = statistics.mean(b - c for b, c in zip(base, challenger, strict=True))
    return wins and gain >= threshold * statistics.mean(base)


def _follow(step: _Search, out: Outcome, ms: float, under: str) -> float:
    """Try each option of a key that a choice (`under`) brought into the step, which took
    `ms` with the key's current pick; leave the fastest applied as out.kept, return its ms."""
    best_ms = ms
    for choice in step.options(out.key):
        if choice == out.start:
            continue
        step.apply(out.key, choice)
        t = step.measure()
        out.trials.append((choice, t))
        step.report(f"{under}, then {out.key}: {choice} {t:.4f} ms (current {out.start}: {ms:.4f})")
        if t < best_ms:
            out.kept, best_ms = choice, t
    step.apply(out.key, out.kept)
    return best_ms


def net_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """One Outcome per key over several passes of descend: its first start, its last kept
    choice and every trial, in the order the keys were first decided (a pick a later pass
    set back to where it started is no change)."""
    net: dict[Hashable, Outcome] = {}
    for o in outcomes:
        if o.key in net:
            net[o.key].kept = o.kept
            net[o.key].trials += o.trials
        else:
            net[o.key] = Outcome(o.key, o.start, o.kept, list(o.trials))
    return list(net.values())


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, object]:
    from mini_sglang.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--tune-batch-size", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--top", type=int, default=3, help="candidates per pick, by time alone")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=48, help="decode steps a measurement")
    parser.add_argument("--threshold", type=float, default=0.005)
    parser.add_argument(
        "--confirm", type=int, default=3, help="rounds a challenger must win (_confirmed)"
    )
    parser.add_argument(
        "--passes", type=int, default=2, help="descents per batch size, until one changes nothing"
    )
    parser.add_argument("--out", type=str, default=None)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--ab-dirs", nargs=2, metavar=("BASE", "TUNED"), default=None)
    args = parser.parse_args(argv)
    if not args.cuda_graph_bs:
        args.cuda_graph_bs = sorted(set(args.tune_batch_size))
    server_args = ServerArgs.from_cli_args(args)
    if server_args.tp_size != 1 or server_args.dp_size != 1:
        parser.error("one GPU: --tp-size 1 --dp-size 1")
    if args.confirm < 1:  # _confirmed keeps no challenger without a round
        parser.error("--confirm must be at least 1")
    return args, server_args


def _bucket(rows: int) -> int:
    """The power-of-two batch bucket both small_m_gemm's picks and the expert tiles key on."""
    return 1 << (rows - 1).bit_length()


class _Recording(dict):
    """small_m_gemm's pick cache, noting each key read (`read`) since it was last cleared."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


def _weight(model, n: int, k: int, fp8: bool):
    """A layer weight of shape (n, k) that a small-M GEMV of that key reads (an e4m3 one for
    an FP8 variant), for timing the candidates alone; None where no layer has one."""
    import torch

    for module in model.modules():
        w = getattr(module, "weight", None)
        if (
            isinstance(w, torch.Tensor)
            and tuple(w.shape) == (n, k)
            and (w.dtype == torch.float8_e4m3fn) == fp8
        ):
            return w.data
    return None


class StepTimer:
    """The real decode step of one model, for descend: apply sets a pick in small_m_gemm's
    cache, measure captures the CUDA graphs again where a pick changed and returns the GPU
    ms a decode step of `batch` rows, options ranks a key's candidates by their time alone.

    `cache.read` holds the keys the last capture read (small_m_gemm._config looks each pick up
    with _choice[key]): a pick timed during a trial stays in the cache after the trial is
    undone, but the step no longer asks for it."""

    def __init__(self, worker, input_len: int, steps: int, top: int) -> None:
        from mini_sglang.layers import small_m_gemm
        from mini_sglang.layers.moe import fused_moe_gemv

        self.worker, self.runner, self.gemm = worker, worker.model_runner, small_m_gemm
        self.input_len, self.steps, self.top = input_len, steps, top
        self.batch, self.dirty = 1, False
        small_m_gemm._choice = self.cache = _Recording(small_m_gemm._choice)
        # The expert GEMVs' tiles: fused_experts_gemv asks default_config at each call, so a
        # wrapper sees the tiles each batch bucket launches (moe_seen, per capture) and
        # replaces them where a trial sets some (moe_tiles, by (bucket, kernel)).
        self.moe_tiles: dict[tuple[int, str], object] = {}
        self.moe_seen: dict[int, object] = {}
        # bucket -> fused_moe_gemv.card_key of the launches seen, for recording the tiles
        self.moe_card_keys: dict[int, str] = {}
        tuned = fused_moe_gemv.default_config

        def default_config(tokens: int, quant: str | None, shape=None, device=None, dtype=None):
            config = tuned(tokens, quant, shape, device, dtype)
            bucket = _bucket(tokens)
            config = dataclasses.replace(
                config,
                gate_up=self.moe_tiles.get((bucket, "gate_up"), config.gate_up),
                down=self.moe_tiles.get((bucket, "down"), config.down),
            )
            self.moe_seen[bucket] = config
            if shape is not None and dtype is not None:
                fmt = fused_moe_gemv.card_format(quant, dtype)
                self.moe_card_keys[bucket] = fused_moe_gemv.card_key(tokens, fmt, shape)
            return config

        fused_moe_gemv.default_config = default_config
        self.capture()  # once more, to record the keys the step reads

    def keys(self, bucket: int) -> list[tuple]:
        """The picks the last capture read at this batch bucket, then its expert GEMVs'
        tiles (keys ("moe", bucket, "gate_up" | "down")) where the step runs them."""
        gemv = sorted((k for k in self.cache.read if k[0] == bucket), key=str)
        moe = [("moe", bucket, kernel) for kernel in ("gate_up", "down")]
        return gemv + (moe if bucket in self.moe_seen else [])

    def capture(self) -> None:
        """Capture the graphs again; where that fails, keep the last capture's records."""
        self.runner.graph_runner.release()
        read, seen = set(self.cache.read), dict(self.moe_seen)
        self.cache.read.clear()
        self.moe_seen.clear()
        try:
            self.runner.init_cuda_graphs()
        except Exception:
            self.cache.read.update(read)
            self.moe_seen.update(seen)
            raise
        self.dirty = False

    def current(self, key: tuple):
        if key[0] == "moe":
            return getattr(self.moe_seen[key[1]], key[2])
        return self.cache.get(key)

    def apply(self, key: tuple, choice) -> None:
        # against what is set, not what the last capture saw: a capture may have failed
        table, name = (self.moe_tiles, key[1:]) if key[0] == "moe" else (self.cache, key)
        if table.get(name, ()) == choice:  # () is no choice; get does not count as a read
            return
        table[name] = choice
        self.dirty = True  # the graphs hold the configs they were captured with

    def measure(self) -> float:
        from mini_sglang.bench_one_batch import run_once

        if self.dirty:
            try:
                self.capture()
            except Exception as e:  # tiles or a config the compiler rejects on this card
                print(f"capture failed ({type(e).__name__}: {e}); timed as never faster")
                return float("inf")
        _, dec, forward_s = run_once(self.worker, self.batch, self.input_len, self.steps + 1)
        return 1000 * forward_s / len(dec)

    def options(self, key: tuple) -> list:
        import torch

        if key[0] == "moe":  # every tile of bench_fused_moe.py's sweep, in the step
            from benchmarks.bench_fused_moe import SWEEP
            from mini_sglang.layers.moe.fused_moe_gemv import GemvTiles

            return [GemvTiles(*tiles) for tiles in SWEEP]
        bucket, n, k, dtype, variant = key
        fp8 = "fp8" in variant or self.gemm.block_of(variant) is not None
        w = _weight(self.runner.model, n, k, fp8)
        if w is None:
            return []
        x = torch.randn((bucket, k), dtype=dtype, device=w.device)
        step_reads = set(self.cache.read)  # an FP8 fallback's timing looks up the plain pick
        times = self.gemm.time_candidates(x, w, variant)
        self.cache.read.clear()
        self.cache.read.update(step_reads)
        ranked = sorted((c for c in times if c is not None), key=times.__getitem__)
        return [None] + ranked[: self.top]


def _changed_tiles(outcomes: list[Outcome]) -> dict[int, object]:
    """The expert tiles of each batch bucket where either kernel's changed, both kernels
    given (a fused_moe_gemv.SmallMConfig), by bucket in order."""
    from mini_sglang.layers.moe.fused_moe_gemv import SmallMConfig

    moe = {o.key[1:]: o for o in outcomes if o.key[0] == "moe"}
    changed = sorted({b for (b, _), o in moe.items() if o.kept != o.start})
    return {
        b: SmallMConfig(moe[(b, "gate_up")].kept, moe[(b, "down")].kept)
        for b in changed
        if (b, "gate_up") in moe and (b, "down") in moe
    }


def _moe_card_entries(outcomes: list[Outcome], card_keys: dict[int, str]) -> dict[str, list]:
    """The expert tiles that changed as fused_moe_gemv.CARD_TABLE entries (the form of
    kernel_configs/moe_gemv_<card>.json)."""
    from mini_sglang.layers.moe.fused_moe_gemv import encode_card_config

    tiles = _changed_tiles(outcomes)
    return {card_keys[b]: encode_card_config(c) for b, c in tiles.items() if b in card_keys}


def _moe_tiles_spec(outcomes: list[Outcome]) -> str:
    """MINI_SGLANG_MOE_GEMV_TILES for the buckets whose expert tiles changed, both kernels
    given, e.g. "1=4,512,1,0:16,256,16,0" (fused_moe_gemv._parse_forced's form)."""

    def spec(t) -> str:
        return ",".join(str(v) for v in (t.block_n, t.block_k, t.num_warps, t.num_stages or 0))

    tiles = _changed_tiles(outcomes)
    return "/".join(f"{b}={spec(c.gate_up)}:{spec(c.down)}" for b, c in tiles.items())


def write_ab_dirs(base: str, tuned: str, card: str, changes: dict[str, dict]) -> None:
    """Two MINI_SGLANG_CACHE_DIR folders for an A/B of the changes: each a copy of this
    process's pick cache (kernel_choices.cache_dir(); nothing if it has none), and in
    `tuned` each table's changes ({table: {key: value}}) written over that card's file."""
    import shutil

    from mini_sglang.layers import kernel_choices

    for root in (base, tuned):
        dst = Path(root) / "kernel_choices"
        shutil.rmtree(dst, ignore_errors=True)
        if Path(kernel_choices.cache_dir()).is_dir():
            shutil.copytree(kernel_choices.cache_dir(), dst)
        dst.mkdir(parents=True, exist_ok=True)
    for table, entries in changes.items():
        if entries:
            path = Path(tuned) / "kernel_choices" / f"{table}_{card}.json"
            data = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(kernel_choices.dumps({**data, **entries}))


def tune_batch(step: StepTimer, batch: int, args: argparse.Namespace) -> list[Outcome]:
    """descend over the picks and expert tiles the step reads at `batch` rows, again while
    a pass changes something, up to --passes (net_outcomes merges the passes)."""
    bucket = _bucket(batch)
    step.batch = batch
    step.measure()  # warm-up: lazy initialisations, the first prefill of this size
    outcomes: list[Outcome] = []
    for n in range(1, args.passes + 1):
        queue = step.keys(bucket)
        print(f"batch {batch}, pass {n}: {len(queue)} picks to try")
        found = descend(
            queue,
            step.current,
            step.options,
            step.apply,
            step.measure,
            new_keys=lambda: step.keys(bucket),
            threshold=args.threshold,
            confirm=args.confirm,
        )
        outcomes += found
        if all(o.kept == o.start for o in found):
            break  # a pass that changed nothing: the next would find the same
    return outcomes


def main(argv: list[str] | None = None) -> list[Outcome]:
    import logging

    from mini_sglang.layers import kernel_choices, small_m_gemm
    from mini_sglang.layers.kernels import wait_flashinfer_builds
    from mini_sglang.layers.moe import fused_moe_gemv
    from mini_sglang.managers.tp_worker import TpModelWorker

    args, server_args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper()))
    worker = TpModelWorker(server_args, gpu_id=server_args.base_gpu_id)
    wait_flashinfer_builds()
    buckets = {_bucket(b) for b in args.tune_batch_size}
    if not any(k[0] in buckets for k in small_m_gemm._choice):
        print("no small-M GEMV picks to tune (they run on CUDA with bf16 / fp16 weights only)")
        return []
    step = StepTimer(worker, args.input_len, args.steps, args.top)
    outcomes = []
    for batch in sorted(set(args.tune_batch_size)):
        outcomes += tune_batch(step, batch, args)
    outcomes = net_outcomes(outcomes)
    changed = {
        small_m_gemm._choice_key(o.key): (list(o.kept) if o.kept else None)
        for o in outcomes
        if o.kept != o.start and o.key[0] != "moe"
    }
    print(f"changed picks: {json.dumps(changed)}")
    moe = _moe_tiles_spec(outcomes)
    moe_entries = _moe_card_entries(outcomes, step.moe_card_keys)
    if moe:
        print(f"expert GEMV tiles that won (an A/B: MINI_SGLANG_MOE_GEMV_TILES={moe})")
        print(f"as {fused_moe_gemv.CARD_TABLE} entries: {json.dumps(moe_entries)}")
    card = kernel_choices.device_name(worker.model_runner.device)
    if args.out:
        tables = {args.out: changed}
        if moe_entries:  # beside --out: picks.json -> picks.moe_gemv.json
            tables[str(Path(args.out).with_suffix(f".{fused_moe_gemv.CARD_TABLE}.json"))] = (
                moe_entries
            )
        for path, table in tables.items():
            with open(path, "w") as f:
                f.write(kernel_choices.dumps(table))
            print(f"wrote {path} (card {card})")
    if args.ab_dirs:  # before --record adds the changes to this run's cache
        write_ab_dirs(
            *args.ab_dirs, card, {"gemv": changed, fused_moe_gemv.CARD_TABLE: moe_entries}
        )
        print(f"wrote the A/B's pick caches {args.ab_dirs[0]} and {args.ab_dirs[1]}")
    if args.record:
        for name, value in changed.items():
            kernel_choices.record("gemv", card, name, value)
        for name, value in moe_entries.items():
            kernel_choices.record(fused_moe_gemv.CARD_TABLE, card, name, value)
    return outcomes


if __name__ == "__main__":
    main()
