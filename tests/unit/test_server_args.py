"""ServerArgs / PortArgs: SGLang 0.5.4's flags, defaults, aliases, resolution and validation."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os

import pytest

from mini_sglang import server_args as sa_mod
from mini_sglang.server_args import PortArgs, ServerArgs, prepare_server_args, resolve_dtype
from mini_sglang.server_args_defaults import (
    compute_mem_fraction_static,
    default_chunked_prefill_and_cuda_graph_max_bs,
    default_page_size,
    generate_cuda_graph_batch_sizes,
)
from mini_sglang.server_args_validation import UNSUPPORTED_FLAGS

MODEL = "/models/some-model"


@pytest.fixture(autouse=True)
def _cpu_only(monkeypatch):
    # Resolution must not depend on whether the test machine has a GPU.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _on_gpu(monkeypatch, mem_mb: float | None, flashinfer: bool = True) -> None:
    monkeypatch.setattr(sa_mod, "get_device_memory_capacity_mb", lambda device: mem_mb)
    monkeypatch.setattr(sa_mod, "flashinfer_available", lambda: flashinfer)


# ---- defaults and aliases -------------------------------------------------------------


def test_cli_defaults_match_sglang():
    a = prepare_server_args(["--model-path", MODEL])
    expected = dict(
        model_path=MODEL, tokenizer_path=MODEL, served_model_name=MODEL, tokenizer_mode="auto",
        load_format="auto", dtype="float32", kv_cache_dtype="auto", quantization=None,
        host="127.0.0.1", port=30000, nccl_port=None, tp_size=1, ep_size=1, pp_size=1, dp_size=1,
        moe_runner_backend="auto", moe_a2a_backend="none",
        load_balance_method="round_robin", max_prefill_tokens=16384, schedule_policy="fcfs",
        schedule_conservativeness=1.0, page_size=1, radix_eviction_policy="lru", cpu_offload_gb=0,
        max_running_requests=None, max_queued_requests=None, max_total_tokens=None,
        stream_interval=1, stream_output=False, watchdog_timeout=300, dist_timeout=None,
        base_gpu_id=0, gpu_id_step=1, log_level="info", log_level_http=None,
        log_requests=False, log_requests_level=2, enable_metrics=False, api_key=None,
        weight_version="default", chat_template=None, completion_template=None,
        multi_item_scoring_delimiter=None,
        enable_cache_report=False, nnodes=1, node_rank=0, dist_init_addr=None,
        json_model_override_args="{}", preferred_sampling_params=None, grammar_backend="xgrammar",
        disable_radix_cache=False, disable_overlap_schedule=False, enable_mixed_chunk=False,
        enable_torch_compile=False, torch_compile_max_bs=32, allow_auto_truncate=False,
        skip_server_warmup=False, skip_tokenizer_init=False, is_embedding=False,
        enable_deterministic_inference=False, enable_return_hidden_states=False,
        disable_cuda_graph_padding=False, context_length=None, trust_remote_code=False,
    )  # fmt: skip
    assert {k: getattr(a, k) for k in expected} == expected
    assert isinstance(a.random_seed, int) and 0 <= a.random_seed <= 2**30


def test_cli_and_dataclass_defaults_agree():
    a = prepare_server_args(["--model-path", MODEL, "--random-seed", "7"])
    b = ServerArgs(model_path=MODEL, random_seed=7)
    assert a == b


def test_aliases():
    a = prepare_server_args(
        ["--model", MODEL, "--tensor-parallel-size", "2", "--nccl-init-addr", "10.0.0.1:5000",
         "--nnodes", "2", "--node-rank", "1"]
    )  # fmt: skip
    assert (a.model_path, a.tp_size, a.nnodes, a.node_rank) == (MODEL, 2, 2, 1)
    assert a.dist_init_addr == "10.0.0.1:5000"
    b = prepare_server_args(["--model", MODEL, "--tp-size", "4", "--data-parallel-size", "3"])
    assert (b.tp_size, b.dp_size) == (4, 3)
    c = prepare_server_args(["--model-path", MODEL, "--dp-size", "2", "--dist-init-addr", "h:1"])
    assert (c.dp_size, c.dist_init_addr) == (2, "h:1")
    for flag in ("--ep-size", "--expert-parallel-size", "--ep"):
        d = prepare_server_args(["--model-path", MODEL, "--tp-size", "4", flag, "2"])
        assert (d.tp_size, d.ep_size) == (4, 2)


def test_add_cli_args_on_own_parser():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model", MODEL, "--port", "31000", "--cuda-graph-bs", "1", "2"])
    a = ServerArgs.from_cli_args(args)
    assert a.port == 31000 and a.cuda_graph_bs == [1, 2] and a.cuda_graph_max_bs == 2
    assert a.url() == "http://127.0.0.1:31000"
    assert ServerArgs(model_path=MODEL, host="::1").url() == "http://[::1]:30000"


def test_unknown_flag_exits_2_and_names_it(capsys):
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--model-path", MODEL, "--no-such-flag", "1"])
    assert e.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_bad_choice_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--model-path", MODEL, "--schedule-policy", "sjf"])
    assert e.value.code == 2 and "--schedule-policy" in capsys.readouterr().err


# ---- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(page_size=0), "--page-size must be >= 1, got 0"),
        (dict(tp_size=0), "--tp-size must be >= 1, got 0"),
        (dict(dp_size=0), "--dp-size must be >= 1, got 0"),
        (dict(ep_size=0), "--ep-size must be >= 1, got 0"),
        (dict(tp_size=2, ep_size=4), r"--tp-size \(2\) must be divisible by --ep-size \(4\)"),
        (dict(port=0), r"--port must be in \[1, 65535\], got 0"),
        (dict(port=70000), r"--port must be in \[1, 65535\], got 70000"),
        (dict(nccl_port=65536), r"--nccl-port must be in \[1, 65535\]"),
        (dict(mem_fraction_static=1.0), r"--mem-fraction-static must be in \(0, 1\), got 1.0"),
        (dict(mem_fraction_static=0.0), r"--mem-fraction-static must be in \(0, 1\), got 0.0"),
        (dict(stream_interval=0), "--stream-interval must be >= 1, got 0"),
        (dict(max_running_requests=0), "--max-running-requests must be >= 1, got 0"),
        (dict(max_total_tokens=0), "--max-total-tokens must be >= 1, got 0"),
        (dict(max_prefill_tokens=0), "--max-prefill-tokens must be >= 1, got 0"),
        (dict(schedule_policy="sjf"), "--schedule-policy: invalid choice 'sjf'"),
        (dict(load_format="onnx"), "--load-format: invalid choice 'onnx'"),
        (dict(dtype="fp8"), "--dtype: invalid choice 'fp8'"),
        (dict(log_requests_level=4), "--log-requests-level: invalid choice 4"),
        (dict(schedule_conservativeness=-1.0), "--schedule-conservativeness must be >= 0"),
        (dict(watchdog_timeout=0), "--watchdog-timeout must be > 0"),
        (dict(cuda_graph_bs=[]), "--cuda-graph-bs must be a non-empty list"),
        (dict(nnodes=2, node_rank=2, tp_size=2), r"--node-rank must be < --nnodes \(2\)"),
        (dict(nnodes=2, tp_size=3), r"--tp-size \(3\) must be divisible by --nnodes \(2\)"),
        (dict(nnodes=2, tp_size=2, dp_size=2), "--dp-size > 1 across several nodes"),
        (dict(json_model_override_args="{bad"), "--json-model-override-args must be a JSON object"),
        (dict(preferred_sampling_params="[1]"), "--preferred-sampling-params must be a JSON object"),
        (dict(dist_init_addr="nohostport"), "--dist-init-addr must be host:port"),
        (dict(page_size=16, chunked_prefill_size=100), r"--chunked-prefill-size \(100\) must be divisible by --page-size \(16\)"),
        (dict(attention_backend="flashinfer"), "--attention-backend=flashinfer needs CUDA"),
    ],
)  # fmt: skip
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path=MODEL, **kwargs)


def test_computed_mem_fraction_out_of_range_is_reported(monkeypatch):
    _on_gpu(monkeypatch, 2048)  # a 2 GB GPU cannot even hold the reserved activations
    with pytest.raises(
        ValueError, match=r"automatic value .* for 2048 MB .*pass --mem-fraction-static explicitly"
    ):
        ServerArgs(model_path=MODEL, device="cuda")


@pytest.mark.parametrize("value", [0, -1, -100])
def test_non_positive_chunked_prefill_means_disabled(value):
    assert ServerArgs(model_path=MODEL, chunked_prefill_size=value).chunked_prefill_size == -1


def test_cpu_mem_fraction_has_a_floor(monkeypatch):
    # 8 GB host, chunking disabled: SGLang's formula gives (8192 - 25256) / 8192 < 0.
    monkeypatch.setattr(sa_mod, "get_device_memory_capacity_mb", lambda device: 8192.0)
    a = ServerArgs(model_path=MODEL, chunked_prefill_size=-1)
    assert a.mem_fraction_static == 0.3
    assert ServerArgs(model_path=MODEL).mem_fraction_static == 0.545  # formula, above floor


def test_log_levels_are_case_insensitive():
    a = prepare_server_args(
        ["--model", MODEL, "--log-level", "DEBUG", "--log-level-http", "Warning"]
    )
    assert (a.log_level, a.log_level_http) == ("debug", "warning")
    with pytest.raises(ValueError, match="--log-level: invalid choice 'loud'"):
        ServerArgs(model_path=MODEL, log_level="loud")


def test_replace_reruns_resolution_idempotently():
    a = ServerArgs(model_path=MODEL, chunked_prefill_size=0, cuda_graph_bs=[1, 2])
    b = dataclasses.replace(a, port=31000)
    assert b.port == 31000 and dataclasses.replace(b, port=a.port) == a


def test_replace_of_a_resolved_copy_keeps_its_values():
    a = ServerArgs(model_path=MODEL, chunked_prefill_size=0, log_level="WARNING")
    assert dataclasses.replace(a) == a
    # the one exception: an explicit max between capture sizes comes back as the largest size
    b = ServerArgs(model_path=MODEL, cuda_graph_max_bs=100)
    assert (b.cuda_graph_max_bs, max(b.cuda_graph_bs)) == (100, 96)
    assert dataclasses.replace(b).cuda_graph_max_bs == 96


def test_check_server_args_revalidates():
    a = ServerArgs(model_path=MODEL)
    a.check_server_args()
    with pytest.raises(ValueError, match="--tp-size"):
        dataclasses.replace(a, tp_size=0)


def test_resolved_server_args_are_frozen():
    a = ServerArgs(model_path=MODEL)
    with pytest.raises(dataclasses.FrozenInstanceError, match="weight_version"):
        a.weight_version = "v2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del a.port
    assert a.weight_version == "default" and a.port == 30000
    b = dataclasses.replace(a, weight_version="v2")  # a derived copy is resolved and frozen
    assert b.weight_version == "v2" and a.weight_version == "default"
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.weight_version = "v3"
    import pickle

    c = pickle.loads(pickle.dumps(a))  # as sent to the scheduler processes
    assert c == a
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.port = 1


# ---- unsupported flags ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, field, reset",
    [
        (["--pp-size", "2"], "pp_size", 1),
        (["--pipeline-parallel-size", "2"], "pp_size", 1),
        (["--quantization", "awq"], "quantization", None),
        (["--enable-torch-compile"], "enable_torch_compile", False),
        (["--enable-lora"], "enable_lora", False),
        (["--lora-paths", "a=/x"], "lora_paths", None),
        (["--speculative-algorithm", "EAGLE"], "speculative_algorithm", None),
        (["--speculative-draft-model", "/d"], "speculative_draft_model_path", None),
        (["--load-format", "bitsandbytes"], "load_format", "auto"),
        (["--schedule-policy", "priority"], "schedule_policy", "fcfs"),
        (["--attention-backend", "fa3"], "attention_backend", "torch_native"),
        (["--device", "xpu"], "device", "cpu"),
        (["--moe-runner-backend", "flashinfer_cutlass"], "moe_runner_backend", "auto"),
        (["--moe-a2a-backend", "deepep"], "moe_a2a_backend", "none"),
    ],
)
def test_unsupported_flag_warns_and_is_ignored(caplog, argv, field, reset):
    with caplog.at_level(logging.WARNING, logger="mini_sglang.server_args"):
        a = prepare_server_args(["--model-path", MODEL, *argv])
    assert getattr(a, field) == reset
    flag = "--" + field.replace("_", "-")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(flag in w and "not supported" in w and "ignored" in w for w in warnings), warnings


def test_moe_runner_backend_triton_is_what_runs(caplog, capsys):
    """The fused Triton MoE kernel is mini-sglang's only MoE runner: asking for it by name
    (as SGLang's Qwen3-MoE recipes do) keeps the value and warns about nothing; a name
    SGLang does not know either is an argparse error."""
    with caplog.at_level(logging.WARNING):
        a = prepare_server_args(["--model-path", MODEL, "--moe-runner-backend", "triton"])
    assert a.moe_runner_backend == "triton"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--model-path", MODEL, "--moe-runner-backend", "fused"])
    assert e.value.code == 2 and "--moe-runner-backend" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["fp8_e4m3", "fp8_e5m2", "bf16"])
def test_kv_cache_dtype_is_kept(caplog, value):
    with caplog.at_level(logging.WARNING):
        a = prepare_server_args(["--model-path", MODEL, "--kv-cache-dtype", value])
    assert a.kv_cache_dtype == value
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_no_warning_for_plain_args(caplog):
    with caplog.at_level(logging.WARNING):
        ServerArgs(model_path=MODEL)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_unsupported_table_names_real_fields():
    names = {f for f in ServerArgs.__dataclass_fields__}
    assert set(UNSUPPORTED_FLAGS) <= names


def test_minimum_tokens_load_balance_becomes_round_robin(caplog):
    with caplog.at_level(logging.WARNING):
        a = ServerArgs(model_path=MODEL, load_balance_method="minimum_tokens")
    assert a.load_balance_method == "round_robin" and "minimum_tokens" in caplog.text


# ---- device, dtype, backends --------------------------------------------------------------


def test_cpu_resolution():
    a = ServerArgs(model_path=MODEL)
    assert (a.device, a.dtype, a.attention_backend, a.sampling_backend) == (
        "cpu", "float32", "torch_native", "pytorch",
    )  # fmt: skip
    assert a.disable_cuda_graph is True and a.disable_overlap_schedule is False
    assert a.chunked_prefill_size == 2048
    assert a.prefill_attention_backend is None and a.decode_attention_backend is None
    assert ServerArgs(model_path=MODEL, dtype="bfloat16").dtype == "bfloat16"


def test_gpu_resolution_h100(monkeypatch):
    _on_gpu(monkeypatch, 81559)
    a = ServerArgs(model_path=MODEL, device="cuda")
    assert (a.chunked_prefill_size, a.cuda_graph_max_bs) == (8192, 256)
    assert a.mem_fraction_static == compute_mem_fraction_static(81559, 8192, 256)
    assert (a.attention_backend, a.sampling_backend) == ("flashinfer", "flashinfer")
    assert a.disable_cuda_graph is False and a.dtype == "auto"
    assert a.cuda_graph_bs[-1] == 256


def test_gpu_backends_without_flashinfer_and_torch_native(monkeypatch, caplog):
    _on_gpu(monkeypatch, 81559, flashinfer=False)
    a = ServerArgs(model_path=MODEL, device="cuda")
    assert (a.attention_backend, a.sampling_backend) == ("triton", "pytorch")
    with caplog.at_level(logging.WARNING):
        b = ServerArgs(model_path=MODEL, device="cuda", attention_backend="torch_native")
    assert b.disable_cuda_graph is True and "Cuda graph is disabled" in caplog.text


def test_gpu_explicit_values_win(monkeypatch):
    _on_gpu(monkeypatch, 81559)
    a = ServerArgs(
        model_path=MODEL, device="cuda", chunked_prefill_size=1024, cuda_graph_max_bs=64,
        mem_fraction_static=0.5,
    )  # fmt: skip
    assert (a.chunked_prefill_size, a.cuda_graph_max_bs, a.mem_fraction_static) == (1024, 64, 0.5)


@pytest.mark.parametrize(
    "config_dtype, expected",
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float16")],
)
def test_gpu_auto_dtype_from_checkpoint(monkeypatch, tmp_path, config_dtype, expected):
    _on_gpu(monkeypatch, 81559)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": config_dtype}))
    assert ServerArgs(model_path=str(tmp_path), device="cuda").dtype == expected


def test_gpu_auto_dtype_follows_the_model_override(monkeypatch, tmp_path):
    """A dtype named by --json-model-override-args is the checkpoint's dtype for "auto"."""
    _on_gpu(monkeypatch, 81559)
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    cases = (
        ({"torch_dtype": "float16"}, "float16"),
        ({"dtype": "float16"}, "float16"),
        ({}, "bfloat16"),
    )
    for override, expected in cases:
        args = ServerArgs(
            model_path=str(tmp_path), device="cuda", json_model_override_args=json.dumps(override)
        )
        assert args.dtype == expected


def test_resolve_dtype_rules():
    import torch

    assert resolve_dtype("auto", "bfloat16") == torch.bfloat16
    assert resolve_dtype("auto", torch.float16) == torch.float16
    assert resolve_dtype("auto", "float32") == torch.float16
    assert resolve_dtype("auto", None) == torch.float16
    assert resolve_dtype("auto", "float32", "gemma2") == torch.bfloat16
    assert resolve_dtype("half", "bfloat16") == torch.float16
    assert resolve_dtype("float", "bfloat16") == torch.float32
    cpu = ServerArgs(model_path=MODEL)
    assert cpu.resolve_torch_dtype("bfloat16") == torch.float32


def test_gguf_file_selects_gguf_loader(tmp_path, caplog):
    path = tmp_path / "model.bin"
    path.write_bytes(b"GGUF" + b"\0" * 16)
    with caplog.at_level(logging.WARNING):
        a = ServerArgs(model_path=str(path))
    assert (a.load_format, a.quantization) == ("gguf", "gguf")
    assert "not supported" not in caplog.text


def test_deterministic_inference_forces_pytorch_sampling(monkeypatch):
    _on_gpu(monkeypatch, 81559)
    a = ServerArgs(model_path=MODEL, device="cuda", enable_deterministic_inference=True)
    assert a.sampling_backend == "pytorch"


# ---- memory heuristics (pure functions) ----------------------------------------------


@pytest.mark.parametrize(
    "mem, tp, expected",
    [
        (16 * 1024, 1, (2048, 8)), (24 * 1024, 1, (2048, 16)), (24 * 1024, 4, (2048, 80)),
        (40 * 1024, 1, (4096, 32)), (40 * 1024, 8, (4096, 160)), (80 * 1024, 1, (8192, 256)),
        (80 * 1024, 4, (8192, 512)), (141 * 1024, 1, (8192, 256)), (180 * 1024, 1, (16384, 512)),
        (None, 1, (4096, 160)),
    ],
)  # fmt: skip
def test_chunked_prefill_and_cuda_graph_tiers(mem, tp, expected):
    assert default_chunked_prefill_and_cuda_graph_max_bs(mem, tp) == expected


@pytest.mark.parametrize(
    "args, expected",
    [
        # reserved = 512 + max(chunk, 2048)*1.5 + bs*2 + tp*pp/8*1024 (>= 10 GB above 60 GB)
        ((8192, 2048, 8, 1, 1), 0.545),  # (8192 - 3728) / 8192
        ((24576, 2048, 16, 1, 1), 0.848),  # (24576 - 3744) / 24576
        ((40960, 4096, 32, 1, 1), 0.833),  # (40960 - 6848) / 40960
        ((65536, 2048, 8, 1, 1), 0.844),  # 3728 < 10240 floor: (65536 - 10240) / 65536
        ((81920, 8192, 256, 1, 1), 0.836),  # (81920 - 13440) / 81920
        ((81920, 8192, 512, 8, 1), 0.819),  # (81920 - 14848) / 81920
        ((81920, -1, 256, 1, 1), 0.686),  # disabled chunking uses max_prefill_tokens 16384
        ((None, 8192, 256, 1, 1), 0.88),  # unknown memory
    ],
)
def test_mem_fraction_static_formula(args, expected):
    assert compute_mem_fraction_static(*args) == expected


def test_cuda_graph_batch_sizes():
    assert generate_cuda_graph_batch_sizes(8) == [1, 2, 4, 8]
    assert generate_cuda_graph_batch_sizes(16) == [1, 2, 4, 8, 12, 16]
    bs160 = generate_cuda_graph_batch_sizes(160)
    assert bs160[:7] == [1, 2, 4, 8, 12, 16, 24] and bs160[-1] == 160 and len(bs160) == 5 + 19
    bs = generate_cuda_graph_batch_sizes(600)
    assert bs[bs.index(256) : bs.index(256) + 3] == [256, 272, 288]
    assert bs[-4:] == [496, 512, 544, 576]
    assert generate_cuda_graph_batch_sizes(5, disable_padding=True) == [1, 2, 3, 4, 5]
    a = ServerArgs(model_path=MODEL, cuda_graph_bs=[4, 1, 2])
    assert a.cuda_graph_max_bs == 4


# ---- config file ------------------------------------------------------------------------


def test_yaml_config_merged_under_cli(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"model-path: {MODEL}\nport: 31000\ndisable_radix_cache: true\nenable-metrics: false\n"
        "cuda-graph-bs: [1, 2, 8]\njson-model-override-args: {rope_theta: 1000}\n"
        "schedule-policy: lpm\n"
    )
    a = prepare_server_args(["--config", str(cfg), "--port", "32000", "--schedule-policy", "lof"])
    assert a.model_path == MODEL and a.port == 32000 and a.schedule_policy == "lof"
    assert a.disable_radix_cache is True and a.enable_metrics is False
    assert a.cuda_graph_bs == [1, 2, 8] and json.loads(a.json_model_override_args) == {
        "rope_theta": 1000
    }
    b = prepare_server_args([f"--config={cfg}"])
    assert b.port == 31000 and b.schedule_policy == "lpm"


def test_yaml_config_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="must be YAML"):
        prepare_server_args(["--config", str(tmp_path / "cfg.json")])
    with pytest.raises(ValueError, match="not found"):
        prepare_server_args(["--config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping"):
        prepare_server_args(["--config", str(bad)])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(f"model-path: {MODEL}\nbogus-key: 1\n")
    with pytest.raises(SystemExit) as e:
        prepare_server_args(["--config", str(unknown)])
    assert e.value.code == 2 and "--bogus-key" in capsys.readouterr().err


# ---- default model hook, public dict, PortArgs ----------------------------------------


def test_model_path_none_uses_default_model(monkeypatch):
    default_model = pytest.importorskip("mini_sglang.model_loader.default_model")
    monkeypatch.setattr(default_model, "resolve_default_model_path", lambda: "/cache/default")
    a = ServerArgs()
    assert (a.model_path, a.tokenizer_path, a.served_model_name) == ("/cache/default",) * 3


def test_to_public_dict_is_json_safe():
    a = ServerArgs(model_path=MODEL, lora_paths=None, cuda_graph_bs=[1, 2])
    d = a.to_public_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["model_path"] == MODEL and d["cuda_graph_bs"] == [1, 2] and d["port"] == 30000


def test_port_args_are_unique_ipc_paths():
    a = ServerArgs(model_path=MODEL)
    p1, p2 = PortArgs.init_new(a), PortArgs.init_new(a)
    names = ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name",
             "rpc_ipc_name", "metrics_ipc_name")  # fmt: skip
    try:
        all_names = [getattr(p, n) for p in (p1, p2) for n in names]
        assert len(set(all_names)) == len(all_names)
        assert all(n.startswith("ipc://") and os.path.exists(n[6:]) for n in all_names)
        assert 30100 <= p1.nccl_port <= 65535
    finally:
        for p in (p1, p2):
            for n in names:
                os.unlink(getattr(p, n)[6:])


def test_port_args_honours_nccl_port():
    p = PortArgs.init_new(ServerArgs(model_path=MODEL, nccl_port=29555), dp_rank=0)
    try:
        assert p.nccl_port == 29555
    finally:
        for n in ("tokenizer_ipc_name", "scheduler_input_ipc_name", "detokenizer_ipc_name",
                  "rpc_ipc_name", "metrics_ipc_name"):  # fmt: skip
            os.unlink(getattr(p, n)[6:])


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors"])
def test_supported_quantization_is_kept(caplog, method):
    with caplog.at_level(logging.WARNING, logger="mini_sglang.server_args"):
        a = prepare_server_args(["--model-path", MODEL, "--quantization", method])
    assert a.quantization == method
    assert "quantization" not in caplog.text


def test_default_page_size_is_16_only_where_xqa_decodes():
    """--page-size unset: 16 for an e4m3 KV cache that flashinfer decodes on sm90+ (XQA's
    smallest page), SGLang's 1 otherwise, and 1 where 16 would not divide the chunk."""
    hopper = ("fp8_e4m3", "flashinfer", (9, 0), 8192, True)
    assert default_page_size(*hopper) == 16
    assert default_page_size("fp8_e4m3", "flashinfer", (10, 0), -1, True) == 16
    for i, other in ((0, "auto"), (0, "fp8_e5m2"), (1, "triton"), (2, (8, 9)), (2, None),
                     (3, 1000), (4, False)):  # fmt: skip
        args = list(hopper)
        args[i] = other
        assert default_page_size(*args) == 1, args


def test_fp8_kv_page_size_resolution(monkeypatch, caplog):
    """ServerArgs asks the GPU's compute capability only for an FP8 KV cache; an explicit
    --page-size always wins; the chosen 16 is logged with how to change it."""
    asked = []
    monkeypatch.setattr(
        sa_mod, "get_device_compute_capability", lambda d: asked.append(d) or (9, 0)
    )
    monkeypatch.delenv("MINI_SGLANG_XQA_DECODE", raising=False)
    base = dict(model_path=MODEL, device="cuda", attention_backend="flashinfer")
    assert ServerArgs(**base).page_size == 1 and asked == []
    with caplog.at_level(logging.INFO, logger="mini_sglang.server_args"):
        assert ServerArgs(**base, kv_cache_dtype="fp8_e4m3").page_size == 16
    assert "Page size is 16 for --kv-cache-dtype fp8_e4m3" in caplog.text
    assert ServerArgs(**base, kv_cache_dtype="fp8_e4m3", page_size=1).page_size == 1
    assert ServerArgs(**base, kv_cache_dtype="fp8_e4m3", page_size=32).page_size == 32
    monkeypatch.setenv("MINI_SGLANG_XQA_DECODE", "0")
    assert ServerArgs(**base, kv_cache_dtype="fp8_e4m3").page_size == 1
    assert ServerArgs(model_path=MODEL, device="cpu", kv_cache_dtype="fp8_e4m3").page_size == 1


def test_gpu_facts_come_from_nvidia_smi(monkeypatch, tmp_path):
    """The launcher reads the smallest GPU's memory and compute capability from nvidia-smi
    (a stand-in script here, answering as a host with an H100 and an L40S would)."""
    from mini_sglang.server_args_defaults import (
        get_device_compute_capability,
        get_device_memory_capacity_mb,
    )

    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        '  --query-gpu=compute_cap) printf "9.0\\n8.9\\n" ;;\n'
        '  --query-gpu=memory.total) printf "81559\\n46068\\n" ;;\n'
        "  *) exit 1 ;;\nesac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert get_device_compute_capability("cuda") == (8, 9)
    assert get_device_memory_capacity_mb("cuda") == 46068.0
    assert get_device_compute_capability("cpu") is None
