"""benchmarks/tune_gemv_in_step.py: the coordinate descent over the picks, driven by a step
whose time is a function of the choices (the script's own measure needs CUDA graphs), the
expert tiles it reports in the form MINI_SGLANG_MOE_GEMV_TILES reads, and the script on
CPU, where no small-M GEMV runs and so nothing is tuned."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.tune_gemv_in_step import (
    Outcome,
    _moe_card_entries,
    _moe_tiles_spec,
    descend,
    main,
    parse_args,
)
from mini_sglang.layers.moe.fused_moe_gemv import (
    GemvTiles,
    SmallMConfig,
    _decode_card_config,
    _parse_forced,
    card_key,
)


class Step:
    """A decode step whose time (ms) is 3 plus the cost of each pick it asks for, plus a
    repeating noise sequence. Like Llama's MLP at one row, it asks for gate_up's SiLU-mul
    pick only where gate_up's norm-fold pick is None (the fold not taken), and that new
    pick starts as the start-up timing would set it."""

    def __init__(self, costs: dict, choice: dict, noise=(0.0,)) -> None:
        self.costs, self.choice = costs, dict(choice)
        self.noise = itertools.cycle(noise)
        self.measured = 0

    def asked(self) -> list:
        keys = [k for k in self.choice if k != "silu_gate_up"]
        if "fold_gate_up" in self.choice and self.choice["fold_gate_up"] is None:
            self.choice.setdefault("silu_gate_up", "persistent")
            keys.append("silu_gate_up")
        return keys

    def measure(self) -> float:
        self.measured += 1
        return 3.0 + next(self.noise) + sum(self.costs[k][self.choice[k]] for k in self.asked())

    def apply(self, key, choice) -> None:
        self.choice[key] = choice


def run(step: Step, options: dict, **kw):
    lines: list[str] = []
    out = descend(
        step.asked(),
        step.choice.get,
        lambda key: options[key],
        step.apply,
        step.measure,
        new_keys=step.asked,
        report=lines.append,
        **kw,
    )
    return out, lines


def test_a_clearly_faster_challenger_is_kept_and_a_marginal_one_is_not():
    costs = {
        "qkv": {"a": 0.10, "b": 0.05, None: 0.20},  # b: 1.6% of the step faster
        "down": {"a": 0.10, "b": 0.099, None: 0.30},  # b: 0.03%, under the threshold
    }
    step = Step(costs, {"qkv": "a", "down": "a"})
    out, lines = run(step, {"qkv": ["a", "b", None], "down": ["a", "b", None]})
    assert [(o.key, o.start, o.kept) for o in out] == [("qkv", "a", "b"), ("down", "a", "a")]
    assert step.choice == {"qkv": "b", "down": "a"}  # the losing challenger was taken back
    # each key: its start, two challengers, then three confirming rounds of both
    assert [len(o.trials) for o in out] == [9, 9]
    assert [c for c, _ in out[0].trials[3:]] == ["a", "b", "b", "a", "a", "b"]  # alternating
    assert any("not kept b" in line for line in lines)


def test_a_challenger_that_loses_a_confirming_round_is_not_kept():
    costs = {"o": {"a": 0.10, "b": 0.05}}
    # noise by measurement: start, challenger, then round 1 (start, challenger), round 2
    # (challenger, start), round 3: the challenger's round-2 time loses to the start's
    step = Step(costs, {"o": "a"}, noise=(0.0, 0.0, 0.0, 0.0, 0.07, 0.0, 0.0, 0.0))
    out, _ = run(step, {"o": ["a", "b"]})
    assert out[0].kept == "a" and step.choice == {"o": "a"}
    assert step.measured == 8


class DriftingStep(Step):
    """Step whose time moves by `drift` ms a measurement, as a GPU's step time drifts
    over a tuning run."""

    def __init__(self, costs: dict, choice: dict, drift: float) -> None:
        super().__init__(costs, choice)
        self.drift = drift

    def measure(self) -> float:
        return super().measure() + self.drift * (self.measured - 1)


def test_a_drifting_step_keeps_a_real_gain_and_no_equal_challenger():
    # The slower the step gets over the run, the later timings of the challenger trail the
    # start's first one; a 2% gain still wins every round against the timing beside it
    # (_confirmed's worked example).
    step = DriftingStep({"down": {"a": 0.10, "b": 0.04}}, {"down": "a"}, drift=0.01)
    out, lines = run(step, {"down": ["a", "b"]})
    assert out[0].kept == "b", lines
    assert step.choice == {"down": "b"}  # left applied, though the last round timed "a"
    assert [round(t, 2) for _, t in out[0].trials] == [
        3.1, 3.05, 3.12, 3.07, 3.08, 3.15, 3.16, 3.11
    ]  # fmt: skip
    # the order alternates, so neither direction of a steady drift makes an equal
    # challenger win every round
    for drift in (0.03, -0.03):
        step = DriftingStep({"down": {"a": 0.10, "b": 0.10}}, {"down": "a"}, drift=drift)
        step.costs["down"]["b"] -= 1e-9  # the scan picks it, then it must win the rounds
        out, lines = run(step, {"down": ["a", "b"]})
        assert out[0].kept == "a", (drift, lines)
        assert step.choice == {"down": "a"}


def test_keys_a_change_brings_into_the_step_are_tuned_too():
    # The shipped H100 case in small: gate_up's persistent norm fold loses to the norm
    # kernel plus a SiLU-mul GEMV, whose pick the step asks for only once the fold is gone.
    costs = {
        "fold_gate_up": {"persistent": 0.50, None: 0.0},
        "silu_gate_up": {"persistent": 0.45, "grid": 0.40},
    }
    step = Step(costs, {"fold_gate_up": "persistent"})
    out, _ = run(
        step, {"fold_gate_up": ["persistent", None], "silu_gate_up": ["persistent", "grid"]}
    )
    assert [(o.key, o.start, o.kept) for o in out] == [
        ("fold_gate_up", "persistent", None),
        ("silu_gate_up", "persistent", "grid"),
    ]
    assert step.choice == {"fold_gate_up": None, "silu_gate_up": "grid"}


def test_a_change_that_wins_only_with_the_picks_it_brings_is_found():
    # Llama-3.1-8B FP8 at one row on an H100: dropping the fold alone runs the SiLU-mul
    # variant's persistent start-up pick and loses; with that pick on the grid config too
    # the step is faster, so the drop is timed with the picks it brings at their best.
    costs = {
        "fold_gate_up": {"persistent": 0.50, None: 0.0},
        "silu_gate_up": {"persistent": 0.55, "grid": 0.40, "dot": 0.60},
    }
    step = Step(costs, {"fold_gate_up": "persistent"})
    options = {"fold_gate_up": ["persistent", None], "silu_gate_up": ["persistent", "grid", "dot"]}
    out, lines = run(step, options)
    assert [(o.key, o.start, o.kept) for o in out] == [
        ("fold_gate_up", "persistent", None),
        ("silu_gate_up", "persistent", "grid"),
    ]
    assert step.choice == {"fold_gate_up": None, "silu_gate_up": "grid"}
    assert [c for c, _ in out[1].trials] == ["grid", "dot"]  # tried once, under the drop
    assert any(line.startswith("fold_gate_up: kept None, silu_gate_up: grid") for line in lines)
    # where even the best of them loses, every pick goes back to where it started
    costs["silu_gate_up"]["grid"] = 0.52
    step = Step(costs, {"fold_gate_up": "persistent"})
    out, _ = run(step, options)
    assert [(o.key, o.start, o.kept) for o in out] == [("fold_gate_up", "persistent", "persistent")]
    assert step.choice == {"fold_gate_up": "persistent", "silu_gate_up": "persistent"}


def test_on_cpu_nothing_is_tuned(tiny_llama_path: str, capsys):
    out = main(["--model-path", tiny_llama_path, "--device", "cpu", "--dtype", "float32"])
    assert out == []
    assert "no small-M GEMV picks to tune" in capsys.readouterr().out


def test_expert_tiles_that_changed_become_one_forced_tiles_value():
    a, b, c = GemvTiles(2, 1024, 1), GemvTiles(4, 256, 8), GemvTiles(16, 256, 16, 3)
    outcomes = [
        Outcome(("moe", 1, "gate_up"), a, a),
        Outcome(("moe", 1, "down"), b, c),
        Outcome(("moe", 2, "gate_up"), a, a),
        Outcome(("moe", 2, "down"), b, b),
        Outcome((1, 4096, 4096, "bfloat16", ()), None, None),
    ]
    spec = _moe_tiles_spec(outcomes)
    assert spec == "1=2,1024,1,0:16,256,16,3"  # bucket 2 kept its tiles: not forced
    assert _parse_forced(spec) == {1: (a, c)}  # the form MINI_SGLANG_MOE_GEMV_TILES reads
    # and as entries of the card's expert tile table, both kernels given
    keys = {b: card_key(b, "bf16", (128, 2048, 768, 8)) for b in (1, 2)}
    entries = _moe_card_entries(outcomes, keys)
    assert entries == {"M1|E128|H2048|I768|k8|bf16": [[2, 1024, 1, None], [16, 256, 16, 3]]}
    assert _decode_card_config(entries[keys[1]]) == SmallMConfig(a, c)


class _Runner:
    """A model runner whose "capture" reads the picks of `keys` as small_m_gemm._config does
    and asks fused_moe_gemv.default_config for one token's expert tiles, raising where the
    tiles asked are `rejected` (as a compile error would)."""

    def __init__(self, keys: list, rejected=None) -> None:
        self.keys, self.rejected, self.captures = keys, rejected, 0
        self.graph_runner = self
        self.model = None

    def release(self) -> None:
        pass

    def init_cuda_graphs(self) -> None:
        from mini_sglang.layers import small_m_gemm
        from mini_sglang.layers.moe import fused_moe_gemv

        for key in self.keys:
            small_m_gemm._choice[key]
        import torch

        shape = (128, 2048, 768, 8)  # Qwen3-30B-A3B's experts, as fused_experts_gemv asks
        config = fused_moe_gemv.default_config(1, None, shape, torch.device("cpu"), torch.bfloat16)
        if config.down == self.rejected:
            raise RuntimeError("tiles rejected")
        self.captures += 1


def test_step_timer_records_reads_overrides_tiles_and_survives_a_failed_capture(monkeypatch):
    from types import SimpleNamespace

    import mini_sglang.bench_one_batch as bench
    from benchmarks.tune_gemv_in_step import StepTimer
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.moe import fused_moe_gemv

    qkv, stale = (1, 5120, 2048, "bf16", ("norm",)), (1, 2048, 4096, "bf16", ())
    monkeypatch.setattr(small_m_gemm, "_choice", {qkv: (2, 0, 8, 1, 2, 4), stale: None})
    monkeypatch.setattr(fused_moe_gemv, "default_config", fused_moe_gemv.default_config)
    bad = GemvTiles(16, 256, 16)
    runner = _Runner([qkv], rejected=bad)
    monkeypatch.setattr(bench, "run_once", lambda *a: (0.0, [0.0] * 4, 0.008))  # 2 ms a step
    step = StepTimer(SimpleNamespace(model_runner=runner), 16, 4, 3)

    # the step's reads, not every cached pick, and the expert kernels where they ran
    assert step.keys(1) == [qkv, ("moe", 1, "gate_up"), ("moe", 1, "down")]
    assert step.moe_card_keys == {1: "M1|E128|H2048|I768|k8|bf16"}  # for recording tiles
    shipped = fused_moe_gemv.TUNED[1]
    assert step.current(("moe", 1, "down")) == shipped.down
    assert step.measure() == 2.0 and runner.captures == 1  # nothing changed: no capture

    step.apply(("moe", 1, "gate_up"), GemvTiles(4, 512, 1))
    assert step.measure() == 2.0 and runner.captures == 2
    assert step.current(("moe", 1, "gate_up")) == GemvTiles(4, 512, 1)

    step.apply(("moe", 1, "down"), bad)
    assert step.measure() == float("inf")  # the capture failed: never faster
    assert step.keys(1)[0] == qkv and step.current(("moe", 1, "down")) == shipped.down
    step.apply(("moe", 1, "down"), shipped.down)  # descend undoing the trial
    assert step.measure() == 2.0 and runner.captures == 3
    assert step.current(("moe", 1, "down")) == shipped.down

    step.apply(qkv, None)
    step.measure()
    assert small_m_gemm._choice[qkv] is None and runner.captures == 4


def test_the_weight_a_pick_is_timed_with_is_found_by_shape_and_format():
    import torch

    from benchmarks.tune_gemv_in_step import _weight

    model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8))
    fp8 = torch.nn.Linear(16, 8, bias=False)
    fp8.weight = torch.nn.Parameter(fp8.weight.data.to(torch.float8_e4m3fn), False)
    model.append(fp8)
    assert _weight(model, 16, 8, fp8=False).data_ptr() == model[0].weight.data_ptr()
    assert _weight(model, 8, 16, fp8=False).dtype == torch.float32  # the bf16 one, not FP8
    assert _weight(model, 8, 16, fp8=True).dtype == torch.float8_e4m3fn
    assert _weight(model, 4, 4, fp8=False) is None


def test_ab_pick_caches_differ_in_the_changes_alone(tmp_path, monkeypatch):
    """--ab-dirs: both caches hold this run's picks; under the tuned one kernel_choices
    reads the changed picks and expert tiles, under the base one the picks it started from."""
    import json

    from benchmarks.tune_gemv_in_step import write_ab_dirs
    from mini_sglang.layers import kernel_choices as kc

    monkeypatch.delenv("MINI_SGLANG_KERNEL_RETUNE", raising=False)
    monkeypatch.setenv("MINI_SGLANG_CACHE_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(kc, "_tables", {})
    gate_up, lm_head = "M2|N28672|K4096|bfloat16|fp8", "M2|N128256|K4096|bfloat16|plain"
    kc.record("gemv", "Card", gate_up, [32, 256, 4, 3, 1])  # start-up picks of the run
    kc.record("gemv", "Card", lm_head, [4, 2048, 4, 2])
    tiles = {"M1|E128|H2048|I768|k8|bf16": [[1, 2048, 1, None], [4, 256, 8, None]]}
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    write_ab_dirs(str(base), str(tuned), "Card", {"gemv": {gate_up: None}, "moe_gemv": tiles})

    def seen(root, table: str, key: str):
        monkeypatch.setenv("MINI_SGLANG_CACHE_DIR", str(root))
        monkeypatch.setattr(kc, "_tables", {})  # a new process
        return kc.lookup(table, "Card", key)

    assert seen(base, "gemv", gate_up) == [32, 256, 4, 3, 1]
    assert seen(tuned, "gemv", gate_up) is None
    assert seen(base, "gemv", lm_head) == seen(tuned, "gemv", lm_head) == [4, 2048, 4, 2]
    key = next(iter(tiles))
    assert seen(base, "moe_gemv", key) is kc.MISSING
    assert seen(tuned, "moe_gemv", key) == tiles[key]
    assert json.loads((tmp_path / "run/kernel_choices/gemv_Card.json").read_text())[gate_up]


class _CoupledStep:
    """A step of two picks whose best choices depend on each other, as on an H100 at batch 2:
    qkv on cuBLAS (None) wins beside the old expert tiles and loses beside the new ones."""

    times = {("a", "old"): 0.50, (None, "old"): 0.40, (None, "new"): 0.30, ("a", "new"): 0.20}

    def __init__(self) -> None:
        self.choice, self.batch = {"qkv": "a", "tiles": "old"}, 0

    def keys(self, bucket: int) -> list[str]:
        return ["qkv", "tiles"]

    def current(self, key: str):
        return self.choice[key]

    def options(self, key: str) -> list:
        return ["a", None] if key == "qkv" else ["old", "new"]

    def apply(self, key: str, choice) -> None:
        self.choice[key] = choice

    def measure(self) -> float:
        return 3.0 + self.times[(self.choice["qkv"], self.choice["tiles"])]


def test_a_second_pass_undoes_a_pick_that_won_only_beside_old_choices(capsys):
    from types import SimpleNamespace

    from benchmarks.tune_gemv_in_step import net_outcomes, tune_batch

    args = SimpleNamespace(passes=3, threshold=0.005, confirm=2)
    step = _CoupledStep()
    outcomes = tune_batch(step, 2, args)
    # pass 1: qkv -> None, tiles -> new; pass 2: qkv back to a; pass 3 changes nothing
    assert [(o.key, o.start, o.kept) for o in outcomes] == [
        ("qkv", "a", None), ("tiles", "old", "new"),
        ("qkv", None, "a"), ("tiles", "new", "new"),
        ("qkv", "a", "a"), ("tiles", "new", "new"),
    ]  # fmt: skip
    assert "pass 3" in capsys.readouterr().out
    net = net_outcomes(outcomes)
    assert [(o.key, o.start, o.kept) for o in net] == [("qkv", "a", "a"), ("tiles", "old", "new")]
    assert len(net[0].trials) == sum(len(o.trials) for o in outcomes if o.key == "qkv")
    assert step.choice == {"qkv": "a", "tiles": "new"}
    # one pass keeps what the first descent found
    step = _CoupledStep()
    args.passes = 1
    assert [(o.key, o.kept) for o in tune_batch(step, 2, args)] == [("qkv", None), ("tiles", "new")]


def test_confirm_needs_at_least_one_round(tmp_path, capsys):
    # with no confirming round _confirmed keeps nothing, so the tuner would find nothing
    with pytest.raises(SystemExit):
        parse_args(["--model-path", str(tmp_path), "--confirm", "0"])
    assert "--confirm must be at least 1" in capsys.readouterr().err
