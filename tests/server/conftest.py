"""Server test helpers: a tiny random model on disk and the real multi-process server.

- `tiny_model` (session): a 2-layer random Llama with the real Qwen3 tokenizer in a tmp dir.
  Its EOS id is set to a token the model really emits greedily for `EOS_PROMPT`, so EOS
  stops can be tested without a trained model.
- `launch_server(model_path, *extra_args)`: start `python -m mini_sglang.launch_server` on a
  free port, wait for /health 200 (failing with the log tail), and return a `ServerHandle`;
  `handle.stop()` sends SIGTERM and asserts the whole process tree is gone.
- `SharedServers` (`shared_servers`, session): servers shared across modules, one per
  distinct launch; `server`, `compact_json_server`, `parser_server`, `metrics_server`
  and `default_model_server` are the launches several modules use.
- `tokenizer`, `hf_model` (session): the tiny model's tokenizer and its HF transformers model.

Servers are expensive on CPU (about 15 s to start), so share them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
# About 15 s on an idle 2-core CPU, but several times that when other test runs share the
# cores; waiting longer costs nothing when the start is fast.
STARTUP_TIMEOUT_S = 300.0
# A GPU server's first start on a fresh machine JIT-compiles flashinfer's and our Triton
# kernels (each TP rank on its own) before it captures CUDA graphs.
GPU_STARTUP_TIMEOUT_S = 600.0
# The prompt whose greedy continuation contains the tiny model's EOS token (see tiny_model).
EOS_PROMPT = "The capital of France is"
# EOS is the greedy token at this position of EOS_PROMPT's continuation (first occurrence).
EOS_POSITION = 3


def _root_conftest() -> Any:
    """tests/conftest.py as a module (its helpers build the same tiny models as the model
    tests; pytest's own `conftest` module name is ambiguous between directories)."""
    name = "_mini_sglang_tests_root_conftest"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ---- tiny model -------------------------------------------------------------------------
@dataclass
class TinyModel:
    path: str
    eos_token_id: int
    # Greedy continuation of EOS_PROMPT with ignore_eos (transformers, float32), and the
    # index of the first EOS in it.
    eos_prompt_ids: list[int]
    greedy_ids: list[int]
    eos_index: int
    vocab_size: int
    context_len: int


def build_tiny_model_dir(out_dir: str | Path, arch: str = "llama", tok: Any = None) -> TinyModel:
    """Save a tiny random `arch` model + Qwen3 tokenizer (`tok`, loaded if not given) into
    out_dir and pick its EOS."""
    from transformers import AutoTokenizer

    root = _root_conftest()
    if tok is None:
        tok = AutoTokenizer.from_pretrained(root.qwen_tokenizer_dir())
    model = root.build_tiny_model(arch, out_dir, tok)
    prompt_ids = tok.encode(EOS_PROMPT)
    greedy = root.hf_greedy(model, prompt_ids, 12, ignore_eos=True)
    # EOS must not appear before EOS_POSITION, or the stop would come earlier.
    eos = next(t for t in greedy[EOS_POSITION:] if t not in greedy[:EOS_POSITION])
    eos_index = greedy.index(eos)
    for name in ("config.json", "generation_config.json"):
        p = Path(out_dir) / name
        if p.exists():
            cfg = json.loads(p.read_text())
            cfg["eos_token_id"] = eos
            p.write_text(json.dumps(cfg, indent=2))
    return TinyModel(
        path=str(out_dir),
        eos_token_id=eos,
        eos_prompt_ids=prompt_ids,
        greedy_ids=greedy,
        eos_index=eos_index,
        vocab_size=model.config.vocab_size,
        context_len=model.config.max_position_embeddings,
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer: Any) -> TinyModel:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_llama"), tok=qwen_tokenizer)


@pytest.fixture(scope="session")
def tokenizer(tiny_model: TinyModel) -> Any:
    """The tiny model's tokenizer (a test module may override it with its own)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.path)


@pytest.fixture(scope="session")
def hf_model(tiny_model: TinyModel) -> Any:
    """The tiny model in HF transformers, float32: the reference for logits and logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model.path, dtype=torch.float32).eval()


# ---- response bodies --------------------------------------------------------------------
def openai_error(message: str) -> dict:
    """SGLang's OpenAI-style 400 body (ErrorResponse) for `message`."""
    return {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


# ---- server process ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerHandle:
    base_url: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    args: list[str] = field(default_factory=list)
    _descendants: list[psutil.Process] = field(default_factory=list)

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-n:])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        """The server process and all its live descendants (remembered for stop())."""
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        known = {p.pid for p in self._descendants}
        self._descendants.extend(p for p in procs if p.pid not in known)
        return procs

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the server, wait for it, and assert no process of its tree survives.

        Returns the exit code. Survivors are SIGKILLed (so a failing test leaks nothing)
        and then reported."""
        self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=10)
            kill_all(self._descendants)
            pytest.fail(f"server did not exit {timeout}s after signal {sig}:\n{self.log_tail()}")
        alive = _root_conftest().wait_until_gone(self._descendants, timeout=10)
        if alive:
            kill_all(alive)
            pytest.fail(f"processes left after shutdown: {[p.pid for p in alive]}")
        return rc

    # Small HTTP helpers (every test talks to the same base URL).
    def get(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 60)
        return requests.get(self.base_url + path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 120)
        return requests.post(self.base_url + path, **kw)

    def memory_accounting(self, headers: dict[str, str] | None = None) -> dict:
        info = self.get("/get_server_info", headers=headers).json()
        state = info["internal_states"][0]
        return {**state["memory_accounting"], "failures": state["memory_check_failures"]}

    def wait_memory_all_free(
        self, timeout: float = 30.0, headers: dict[str, str] | None = None
    ) -> dict:
        """Poll until no KV slot or request slot is held (cached prefixes may stay evictable);
        fail with the last accounting otherwise. `headers` go with each request (a server
        started with --api-key needs its Authorization)."""
        deadline = time.time() + timeout
        m: dict = {}
        while time.time() < deadline:
            m = self.memory_accounting(headers)
            if (
                m["protected"] == 0
                and m["free"] + m["evictable"] == m["capacity"]
                and m["free_req_slots"] == m["req_slots"]
            ):
                return m
            time.sleep(0.25)
        raise AssertionError(f"KV / request slots not freed within {timeout}s: {m}")


def kill_all(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def start_server(
    model_path: str | None,
    *extra_args: str,
    log_dir: Path,
    port: int | None = None,
    max_total_tokens: int = 4096,
    env: dict[str, str] | None = None,
) -> ServerHandle:
    """Start the server subprocess (not waiting for readiness); env adds to os.environ."""
    port = port or free_port()
    args = [sys.executable, "-m", "mini_sglang.launch_server", "--port", str(port)]
    if model_path is not None:
        args += ["--model-path", model_path]
    args += ["--max-total-tokens", str(max_total_tokens), *extra_args]
    log_path = log_dir / f"server_{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(REPO_ROOT),
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    return ServerHandle(f"http://127.0.0.1:{port}", port, proc, log_path, args)


def wait_ready(handle: ServerHandle, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll /health until 200; fail with the log tail on timeout or early exit."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if handle.proc.poll() is not None:
            pytest.fail(
                f"server exited with {handle.proc.returncode} during start-up:\n{handle.log_tail()}"
            )
        try:
            if handle.get("/health", timeout=5).status_code == 200:
                handle.tree()
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    handle.stop(signal.SIGKILL)
    pytest.fail(f"server not healthy after {timeout}s:\n{handle.log_tail()}")


def launch_server(
    model_path: str | None,
    *extra_args: str,
    log_dir: Path,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    **kw: Any,
) -> ServerHandle:
    handle = start_server(model_path, *extra_args, log_dir=log_dir, **kw)
    wait_ready(handle, startup_timeout)
    return handle


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server_logs")


class SharedServers:
    """The session's shared servers: one per distinct launch (model path, flags, extra
    environment), started on first use and stopped (SIGTERM, whole tree gone) when the
    session ends. Test modules that need a server with the same launch get the same one.

    A module using a shared server must leave it as it found it: every request finished,
    generation not paused, no state a later module could observe (rely only on what the
    module itself sent). `get` checks the part that can be checked: before handing out a
    server again it waits until every KV and request slot is free, and fails naming the
    module that used it last otherwise. A server that died is started afresh.
    """

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._servers: dict[tuple, tuple[ServerHandle, str]] = {}

    def get(
        self,
        model_path: str | None,
        *extra_args: str,
        env: dict[str, str] | None = None,
        user: str = "",
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ) -> ServerHandle:
        """The running server for this launch, started if needed; `user` names the caller
        (its module) for the hand-over check's failure message."""
        key = (model_path, extra_args, tuple(sorted((env or {}).items())))
        entry = self._servers.get(key)
        if entry is not None and entry[0].proc.poll() is None:
            handle, last_user = entry
            headers = None
            if "--api-key" in extra_args:
                key = extra_args[extra_args.index("--api-key") + 1]
                headers = {"Authorization": f"Bearer {key}"}
            try:
                handle.wait_memory_all_free(headers=headers)
            except AssertionError as e:
                pytest.fail(f"shared server {extra_args} left busy by {last_user}: {e}")
        else:
            handle = launch_server(
                model_path,
                *extra_args,
                log_dir=self._log_dir,
                env=env,
                startup_timeout=startup_timeout,
            )
        self._servers[key] = (handle, user)
        return handle

    def stop_all(self) -> None:
        """Stop every server, each even if stopping an earlier one failed."""
        servers, self._servers = [h for h, _ in self._servers.values()], {}
        with contextlib.ExitStack() as stack:
            for handle in servers:
                stack.callback(handle.stop)


@pytest.fixture(scope="session")
def shared_servers(server_logs: Path) -> Iterator[SharedServers]:
    pool = SharedServers(server_logs)
    yield pool
    pool.stop_all()


# The shared `server`'s test hook (environ.py): preparing the request with this rid raises
# in the scheduler, so a test can check that the failure stays contained to that request.
# No other rid is affected.
FAIL_PREPARE_RID = "prepare-fails"
# Compact JSON under JSON constraints: a random model given free whitespace inside JSON may
# emit it forever.
COMPACT_JSON_ARGS = ("--constrained-json-disable-any-whitespace",)
PARSER_ARGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25", *COMPACT_JSON_ARGS)


# The shared servers below are module-scoped views of session-wide servers, so that each
# module's hand-over is checked (SharedServers.get).
@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tiny_model: TinyModel, shared_servers: SharedServers
) -> ServerHandle:
    """The server on the tiny model with default flags (and the FAIL_PREPARE_RID hook)."""
    env = {"MINI_SGLANG_TEST_FAIL_PREPARE_RID": FAIL_PREPARE_RID}
    return shared_servers.get(tiny_model.path, env=env, user=request.module.__name__)


@pytest.fixture(scope="module")
def compact_json_server(
    request: pytest.FixtureRequest, tiny_model: TinyModel, shared_servers: SharedServers
) -> ServerHandle:
    """The tiny model's server with COMPACT_JSON_ARGS."""
    return shared_servers.get(tiny_model.path, *COMPACT_JSON_ARGS, user=request.module.__name__)


@pytest.fixture(scope="module")
def parser_server(
    request: pytest.FixtureRequest, tiny_model: TinyModel, shared_servers: SharedServers
) -> ServerHandle:
    """The tiny model's server with the Qwen3 reasoning parser and the Qwen2.5 tool-call
    parser (PARSER_ARGS); a profile started without an output directory writes its trace
    to api_fuzz_cases.PROFILE_DIR, never into the repository."""
    from tests.server.api_fuzz_cases import PROFILE_DIR

    env = {"SGLANG_TORCH_PROFILER_DIR": PROFILE_DIR}
    return shared_servers.get(tiny_model.path, *PARSER_ARGS, env=env, user=request.module.__name__)


# The key of `metrics_server`.
METRICS_API_KEY = "k"


@pytest.fixture(scope="module")
def metrics_server(
    request: pytest.FixtureRequest, tiny_model: TinyModel, shared_servers: SharedServers
) -> ServerHandle:
    """The tiny model's server with --enable-metrics, --api-key METRICS_API_KEY and
    --enable-cache-report."""
    return shared_servers.get(
        tiny_model.path,
        "--enable-metrics",
        "--api-key",
        METRICS_API_KEY,
        "--enable-cache-report",
        user=request.module.__name__,
    )


@pytest.fixture(scope="module")
def default_model_server(
    request: pytest.FixtureRequest, shared_servers: SharedServers
) -> ServerHandle:
    """The server on the embedded default model (no --model-path), logging each request's
    inputs (--log-requests at level 1)."""
    return shared_servers.get(
        None,
        "--log-requests",
        "--log-requests-level",
        "1",
        user=request.module.__name__,
        # The first start after an install converts the model (tens of seconds on a busy CPU).
        startup_timeout=600,
    )


# ---- SSE parsing ------------------------------------------------------------------------
def parse_sse(body: bytes) -> list[Any]:
    """Split an SSE body into events, asserting SGLang's exact framing: every event is
    `data: <one-line json>\\n\\n` and the last is `data: [DONE]\\n\\n`. Returns the JSON
    payloads (without [DONE])."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    chunks = body.split(b"\n\n")
    assert chunks[-1] == b"", "body must end with a blank line"
    events = []
    for chunk in chunks[:-2]:
        assert chunk.startswith(b"data: "), chunk[:100]
        payload = chunk[len(b"data: ") :]
        assert b"\n" not in payload and b"\r" not in payload, payload[:100]
        events.append(json.loads(payload))
    assert chunks[-2] == b"data: [DONE]"
    return events
