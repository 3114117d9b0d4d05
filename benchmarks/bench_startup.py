"""Server start-up time: from `python -m ...` to the first generated token, fresh and warm.

    python benchmarks/bench_startup.py --model-dir /tmp/m/llama-3.1-8b \
        [--engines ours,minisgl] [--rounds 2] [--fresh] [--out startup.jsonl] [--log-dir DIR]

Each arm spawns the engine's HTTP server with dummy weights and polls its /generate until one
token comes back; the time from spawn to that reply is the start-up time a user waits. The
arms alternate per round, so machine drift hits each alike. Each engine keeps its compile
caches (FlashInfer's, Triton's, torch inductor's, mini-sglang's kernel picks) under its own
folder in --cache-root, so one engine's fresh start never cools the other's. With --fresh
every arm starts with its engine's caches removed, as on a new machine; without it the
caches its earlier starts left are used (a warm start: run the fresh kind first, or an
untimed start). The server's log goes to DIR/<engine>_<round>.log: mini-sglang logs each
start-up phase with its duration, which says where the time went.

After its first token a mini-sglang server may still be compiling flashinfer modules in the
background (its first requests use stand-ins meanwhile, docs/performance/startup.md). The
arm keeps the server up until its log says every such build ended (at most --settle-timeout
seconds, reported as "settled"), as a server left running would: stopped at the first
token, the builds would die unfinished and every later "warm" start would compile again.

The second engine is sgl-project/mini-sglang (`minisgl`, importable from PYTHONPATH); it is
never a dependency of this project.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def cache_env(cache_root: str, engine: str) -> dict[str, str]:
    """The engine's own compile-cache folders, as the environment variables that place them."""
    root = os.path.join(cache_root, engine)
    return {
        "FLASHINFER_WORKSPACE_BASE": root,  # flashinfer: <root>/.cache/flashinfer
        "TRITON_CACHE_DIR": os.path.join(root, "triton"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
        "MINI_SGLANG_CACHE_DIR": os.path.join(root, "mini_sglang"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(engine: str, model_dir: str, port: int) -> list[str]:
    if engine == "ours":
        return [sys.executable, "-m", "mini_sglang.launch_server", "--model-path", model_dir,
                "--load-format", "dummy", "--port", str(port)]  # fmt: skip
    if engine == "minisgl":
        # flashinfer named explicitly: its "auto" picks FA3 (sgl_kernel) on Hopper
        return [sys.executable, "-m", "minisgl", "--model-path", model_dir, "--dummy-weight",
                "--port", str(port), "--attention-backend", "fi"]  # fmt: skip
    raise SystemExit(f"unknown engine {engine!r} (ours, minisgl)")


def probe(engine: str, port: int) -> bool:
    """One token from the server's /generate, True once it answers 200."""
    body = (
        {"text": "Hello", "sampling_params": {"max_new_tokens": 1}}
        if engine == "ours"
        else {"prompt": "Hello", "max_tokens": 1}
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def clear_caches(cache_root: str, engine: str) -> None:
    shutil.rmtree(os.path.join(cache_root, engine), ignore_errors=True)


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


BUILDS_STARTED = "flashinfer modules compiling in the background: "


def builds_pending(log_text: str) -> int:
    """How many of the background flashinfer builds a mini-sglang log announced have not yet
    logged their end ("flashinfer module NAME built in ..." or "...: build failed")."""
    pending = 0
    for line in log_text.splitlines():
        if BUILDS_STARTED in line:
            names = line.split(BUILDS_STARTED, 1)[1].strip().split(", ")
            pending += sum(
                f"flashinfer module {n} built in" not in log_text
                and f"flashinfer module {n}: build failed" not in log_text
                for n in names
            )
    return pending


def settle(proc: subprocess.Popen, log_path: str, deadline: float) -> bool:
    """Wait until the server's background builds (builds_pending) ended, it exited, or the
    perf_counter deadline passed; whether they ended."""
    while time.perf_counter() < deadline and proc.poll() is None:
        with open(log_path, errors="replace") as f:
            if builds_pending(f.read()) == 0:
                return True
        time.sleep(1.0)
    return False


def time_start(
    engine: str,
    model_dir: str,
    log_path: str,
    timeout: float,
    env: dict[str, str],
    settle_timeout: float = 0.0,
) -> tuple[float | None, float | None]:
    """(seconds from spawn to the first token, or None if the server died or timed out;
    seconds from spawn until its background builds ended, None where they did not end
    within settle_timeout after the first token)."""
    port = free_port()
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            launch_command(engine, model_dir, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
        )
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    return None
                if probe(engine, port):
                    first = time.perf_counter() - t0
                    log.flush()
                    done = settle(proc, log_path, time.perf_counter() + settle_timeout)
                    return first, (time.perf_counter() - t0 if done else None)
                time.sleep(0.25)
            return None, None
        finally:
            stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--engines", default="ours,minisgl")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fresh", action="store_true", help="remove compile caches before each arm")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--settle-timeout",
        type=float,
        default=300.0,
        help="seconds to keep a server up after its first token for its background builds",
    )
    ap.add_argument("--out", default=None, help="append one JSON line per arm")
    ap.add_argument("--log-dir", default=".")
    ap.add_argument("--cache-root", default=os.path.expanduser("~/.cache/bench_startup"))
    args = ap.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    model = os.path.basename(os.path.normpath(args.model_dir))
    kind = "fresh" if args.fresh else "warm"
    for rnd in range(args.rounds):
        for engine in args.engines.split(","):
            if args.fresh:
                clear_caches(args.cache_root, engine)
            log_path = os.path.join(args.log_dir, f"startup_{engine}_{model}_{kind}_{rnd}.log")
            env = cache_env(args.cache_root, engine)
            secs, settled = time_start(
                engine, args.model_dir, log_path, args.timeout, env, args.settle_timeout
            )
            row = {"engine": engine, "model": model, "start": kind, "round": rnd, "seconds": secs}
            row["settled_seconds"] = settled
            shown = "failed (see log)" if secs is None else f"{secs:.1f} s"
            if secs is not None and settled is not None and settled - secs > 1:
                shown += f" (background builds ended at {settled:.1f} s)"
            print(f"startup {kind} round {rnd} {engine} {model}: {shown}  [{log_path}]", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
