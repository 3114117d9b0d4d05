"""Start-up checks and the wait for the server's child processes: a user error (a port in
use, a model path that cannot be served) and a child that cannot start each end the start
promptly with one `StartupError` line that says what is wrong and what to do.

`check_port_available`, `check_model_path`, `check_tp_size` and `check_quantization` run
in the parent before any child starts (before any weight is loaded).

Contract of `wait_for_children`: it returns the ready reports of the children that have a
pipe, in order, once every one has reported "ready"; if any child (with a pipe or not)
exits, or reports an error, before that, it raises `StartupError` naming that child and its
exit code, within about a second of the exit. It never blocks on a dead child: the parent
must have closed its own copy of each pipe's write end (`close_parent_ends`), so a child's
death is an EOF, and each child's process sentinel is watched beside its pipe.

A script that creates an `Engine` at import time, without an
`if __name__ == "__main__":` guard, would make every spawned child re-run it while
bootstrapping. `check_main_guard` finds that case in the parent before any child starts
(the call's line in the main script is outside every `if` that tests `__name__`); as a
backstop for guards it cannot see through, `exit_if_bootstrapping_child` ends such a child
with `MISSING_MAIN_GUARD_EXIT_CODE`, which the parent turns into the same advice.
"""

from __future__ import annotations

import ast
import glob
import json
import multiprocessing as mp
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection, wait
from typing import Any

from mini_sglang.utils.gguf_path import is_gguf_path

# A spawned child that found itself re-running the main script's Engine() exits with this.
MISSING_MAIN_GUARD_EXIT_CODE = 86

MISSING_MAIN_GUARD_HINT = (
    'the script that creates the Engine has no `if __name__ == "__main__":` guard; '
    "child processes are spawned and re-import the main script, so put the code that "
    "creates the Engine under that guard"
)


class StartupError(RuntimeError):
    """The server or engine could not start; the message is one line a user can act on."""


def check_port_available(host: str, port: int) -> None:
    """Raise StartupError unless `host:port` can be listened on (bound as uvicorn binds it,
    with SO_REUSEADDR, so a port in TIME_WAIT is not reported)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            raise StartupError(
                f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); stop the "
                "process using it or pass another --port"
            ) from None


def _looks_like_repo_id(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~"))


def check_model_path(model_path: str, load_format: str) -> None:
    """Raise StartupError unless `model_path` is something mini-sglang can load: an HF
    checkpoint directory (config.json, and *.safetensors or *.bin weights unless
    --load-format dummy) or a readable GGUF file. Hub ids are not downloaded."""
    flag = f"--model-path {model_path}"
    if not os.path.exists(model_path):
        if _looks_like_repo_id(model_path):
            raise StartupError(
                f"{flag}: no such local directory, and mini-sglang does not download from a "
                f"model hub; download it first (huggingface-cli download {model_path} "
                "--local-dir DIR) and pass --model-path DIR"
            )
        raise StartupError(f"{flag}: no such file or directory")
    if os.path.isfile(model_path):
        if not is_gguf_path(model_path):
            raise StartupError(f"{flag}: a file that is not GGUF; pass a model directory")
        # Local: gguf_loader imports gguf and torch; these checks run before either loads.
        from mini_sglang.model_loader.gguf_loader import gguf_config_dict

        try:
            gguf_config_dict(model_path)
        except Exception as e:
            raise StartupError(
                f"{flag}: cannot read it as GGUF ({e}); download the file again"
            ) from None
        return
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise StartupError(f"{flag}: the directory has no config.json (not an HF checkpoint)")
    if load_format == "dummy":
        return
    weights = glob.glob(os.path.join(model_path, "*.safetensors")) + glob.glob(
        os.path.join(model_path, "*.bin")
    )
    if not weights:
        raise StartupError(
            f"{flag}: no model weights (*.safetensors or *.bin) in the directory; add them, "
            "or pass --load-format dummy for random weights"
        )


def _in_name_guard(tree: ast.Module, lineno: int) -> bool:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and node.lineno <= lineno <= (node.end_lineno or 0)):
            continue
        if any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)):
            return True
    return False


def check_main_guard() -> None:
    """Raise StartupError if the main script's top-level code is creating the engine
    outside an `if __name__ ...:` block (scripts only: not -c, a REPL or a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or mp.parent_process() is not None:
        return
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    if not _in_name_guard(tree, frame.f_lineno):
        raise StartupError(f"{path}, line {frame.f_lineno}: {MISSING_MAIN_GUARD_HINT}")


def exit_if_bootstrapping_child() -> None:
    """In a spawned child that is re-importing the main script (multiprocessing marks it
    `_inheriting` then), starting an engine is the missing-guard mistake: exit with
    MISSING_MAIN_GUARD_EXIT_CODE instead of multiprocessing's long traceback."""
    if getattr(mp.current_process(), "_inheriting", False):
        print(f"mini_sglang: {MISSING_MAIN_GUARD_HINT}.", file=sys.stderr, flush=True)
        sys.exit(MISSING_MAIN_GUARD_EXIT_CODE)


def close_parent_ends(writers: list[Connection]) -> None:
    """Close the parent's copies of the pipes' write ends (after the children started), so
    that a child's exit reads as EOF instead of a wait that never ends."""
    for w in writers:
        w.close()


def describe_exit(proc: mp.Process) -> str:
    """'<name> (pid N) exited with code C' (a signal by its name), plus the guard hint."""
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            how = f"exited with code {code}"
    else:
        how = f"exited with code {code}"
    text = f"{proc.name} (pid {proc.pid}) {how} during start-up"
    if code == MISSING_MAIN_GUARD_EXIT_CODE:
        text += f": {MISSING_MAIN_GUARD_HINT}"
    else:
        text += "; see its log above"
    return text


def check_tp_size(server_args: Any) -> None:
    """Raise StartupError unless --tp-size splits the model evenly across the ranks: its
    attention heads, its key-value heads (each rank holds a share, or a replica when there
    are fewer than ranks) and its MLP width; and, for a mixture of experts, unless
    --ep-size splits its experts and the tp / ep ranks that share an expert split that
    expert's intermediate size (layers/moe/layer.py). Reads only the model's config."""
    tp = server_args.tp_size
    if tp == 1:
        return
    # Local: ModelConfig imports transformers (seconds); only a TP launch reads the config.
    from mini_sglang.model_config import ModelConfig

    cfg = ModelConfig.from_server_args(server_args)
    hf = cfg.hf_config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    intermediate = getattr(hf, "intermediate_size", None)
    flag = f"--tp-size {tp}"
    if heads % tp:
        raise StartupError(f"{flag} does not divide the model's {heads} attention heads")
    if (kv_heads % tp) if tp < kv_heads else (tp % kv_heads):
        raise StartupError(
            f"{flag} and the model's {kv_heads} key-value heads: one must divide the other"
        )
    moe = bool(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None))
    # A Mixtral config's intermediate_size is its experts' (checked below, split tp / ep ways)
    dense_mlp = not moe or getattr(hf, "moe_intermediate_size", None) is not None
    if dense_mlp and isinstance(intermediate, int) and intermediate % tp:
        raise StartupError(f"{flag} does not divide the model's intermediate size {intermediate}")
    if moe:
        _check_moe_split(hf, tp, server_args.ep_size)


def _check_moe_split(hf_config: Any, tp: int, ep: int) -> None:
    """check_tp_size's part for a mixture-of-experts config."""
    # Local: the model package imports the layers (torch kernels); only an MoE TP launch.
    from mini_sglang.models.sparse_moe import moe_settings

    moe = moe_settings(hf_config)
    experts, inter, per_expert = moe["num_experts"], moe["intermediate_size"], tp // ep
    if experts % ep:
        raise StartupError(f"--ep-size {ep} does not divide the model's {experts} experts")
    if inter % per_expert:
        raise StartupError(
            f"--tp-size {tp} / --ep-size {ep} = {per_expert} ranks share each expert and do not "
            f"divide its intermediate size {inter}; choose sizes whose quotient divides it"
        )
    shared = getattr(hf_config, "shared_expert_intermediate_size", 0) or 0
    if shared % tp:
        raise StartupError(
            f"--tp-size {tp} does not divide the model's shared expert intermediate size {shared}"
        )


def check_quantization(server_args: Any) -> None:
    """Raise StartupError unless mini-sglang can serve the model's quantization
    (--quantization and the checkpoint's config.json quantization_config, or the one
    --json-model-override-args gives; see layers/quantization/methods.py). Reads only
    config.json."""
    from mini_sglang.layers.quantization.methods import parse_quantization

    path = os.path.join(server_args.model_path, "config.json")
    hf_quant_config = None
    if os.path.isfile(path):
        try:
            with open(path) as f:
                config = json.load(f)
        except (OSError, ValueError):
            config = {}  # unreadable: the model config's own loading reports it
        # --json-model-override-args' keys replace config.json's, as in the model config.
        config.update(json.loads(getattr(server_args, "json_model_override_args", None) or "{}"))
        hf_quant_config = config.get("quantization_config") or (
            config.get("text_config") or {}
        ).get("quantization_config")
    try:
        parse_quantization(server_args.quantization, hf_quant_config)
    except ValueError as e:
        raise StartupError(f"--model-path {server_args.model_path}: {e}") from None


def wait_for_children(
    piped: list[tuple[mp.Process, Connection]], others: list[mp.Process]
) -> list[dict[str, Any]]:
    """Wait for each piped child's {"status": "ready", ...} report; see the module contract."""
    infos: dict[int, dict[str, Any]] = {}
    pending = dict(enumerate(piped))
    by_sentinel = {p.sentinel: p for p, _ in piped}
    by_sentinel.update({p.sentinel: p for p in others})
    while pending:
        readers = {r: i for i, (_, r) in pending.items()}
        ready = wait([*readers, *by_sentinel])
        # Pipes first: a child that reported and then exited is judged by its report.
        for obj in ready:
            if obj in readers:
                i = readers[obj]
                proc = pending[i][0]
                try:
                    info = obj.recv()
                except EOFError:
                    proc.join(timeout=5)
                    raise StartupError(describe_exit(proc)) from None
                if info.get("status") != "ready":
                    error = str(info.get("error") or "").strip()
                    last = error.splitlines()[-1] if error else "no details"
                    raise StartupError(f"{proc.name} failed to start: {last}")
                infos[i] = info
                del pending[i]
        for obj in ready:
            if obj in by_sentinel:
                proc = by_sentinel[obj]
                # A piped child's report may still be in its pipe: read it next round.
                if any(p is proc and r.poll() for p, r in pending.values()):
                    continue
                if any(p is proc for p, _ in pending.values()) or proc in others:
                    proc.join(timeout=5)
                    raise StartupError(describe_exit(proc))
                del by_sentinel[obj]  # reported ready, then exited: the watcher's business
    return [infos[i] for i in range(len(piped))]
