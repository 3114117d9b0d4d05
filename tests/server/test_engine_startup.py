"""Engine start-up failures end the start promptly with one clear error: a script without
an `if __name__ == "__main__":` guard is told to add it, and a child killed while it starts
is named with its exit code; neither hangs nor leaves a process behind."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.server.conftest import REPO_ROOT, TinyModel

UNGUARDED_SCRIPT = """
import sys
import mini_sglang

engine = mini_sglang.Engine(model_path=sys.argv[1], max_total_tokens=2048)
print("started", flush=True)
engine.shutdown()
"""

GUARDED_SCRIPT = """
import sys
import mini_sglang

if __name__ == "__main__":
    engine = mini_sglang.Engine(model_path=sys.argv[1], max_total_tokens=2048)
    print("started", flush=True)
    engine.shutdown()
"""


def _run(script: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(REPO_ROOT),
    )


def _assert_no_orphans(seen: dict[int, psutil.Process]) -> None:
    deadline = time.monotonic() + 10
    alive = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def _run_to_end(script: Path, *args: str, timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = _run(script, *args)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{script.name}: the Engine start hung") from None
    return proc.returncode, err, time.monotonic() - start


def test_engine_without_main_guard_says_to_add_it(tiny_model: TinyModel, tmp_path: Path):
    """Found in the parent, before any child is spawned."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    rc, err, elapsed = _run_to_end(script, tiny_model.path, timeout=60)
    assert rc != 0
    last = err.strip().splitlines()[-1]
    assert "StartupError" in last and 'if __name__ == "__main__":' in last, err[-3000:]
    assert f"{script}, line 5" in last, last
    assert elapsed < 30, elapsed


def test_children_that_rerun_the_engine_say_to_add_the_guard(tiny_model: TinyModel, tmp_path: Path):
    """A guard that is true in the spawned children too (the parent cannot tell): each
    child stops at its Engine() and the parent names it with the advice."""
    script = tmp_path / "misguarded.py"
    script.write_text(
        UNGUARDED_SCRIPT.replace(
            "engine = ", 'if __name__ in ("__main__", "__mp_main__"):\n    engine = '
        )
        .replace('print("started"', '    print("started"')
        .replace("engine.shutdown()", "    engine.shutdown()")
    )
    rc, err, _ = _run_to_end(script, tiny_model.path, timeout=120)
    assert rc != 0
    last = err.strip().splitlines()[-1]
    assert "StartupError" in last and 'if __name__ == "__main__":' in last, err[-3000:]
    assert "exited with code 86" in last, last


def test_scheduler_killed_during_startup_is_named(tiny_model: TinyModel, tmp_path: Path):
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED_SCRIPT)
    proc = _run(script, tiny_model.path)
    parent = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            kids = [
                p
                for p in parent.children()
                if any(m in " ".join(p.cmdline()) for m in ("spawn_main", "mini_sglang::"))
            ]
        except psutil.NoSuchProcess:
            break
        if kids:
            victim = min(kids, key=lambda p: (p.create_time(), p.pid))  # the scheduler
        time.sleep(0.05)
    assert victim is not None, "no scheduler process appeared"
    for p in parent.children(recursive=True):
        seen[p.pid] = p
    victim.kill()
    killed_at = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the Engine start hung after its scheduler was killed") from None
    assert time.monotonic() - killed_at < 30
    assert proc.returncode != 0 and "started" not in out
    last = err.strip().splitlines()[-1]
    assert "scheduler_TP0" in last and "SIGKILL" in last, err[-3000:]
    _assert_no_orphans(seen)
