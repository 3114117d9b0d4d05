"""utils.process.set_parent_death_signal: a child process dies with its parent, also when the
parent died while the child was still starting (before it could ask Linux to signal it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil
import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux-only")


def test_child_whose_parent_died_during_its_start_kills_itself(tmp_path):
    (tmp_path / "late_child.py").write_text(
        textwrap.dedent(
            """
            import time
            from mini_sglang.utils.process import set_parent_death_signal

            def run():
                time.sleep(3)  # a slow start: the parent exits meanwhile
                set_parent_death_signal()
                time.sleep(120)
            """
        )
    )
    parent = textwrap.dedent(
        f"""
        import multiprocessing, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import late_child
        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=late_child.run)
            child.start()
            print(child.pid, flush=True)
            os._exit(0)  # no join: the child is orphaned before its sleep ends
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True
    )
    child = psutil.Process(int(out.stdout.split()[0]))
    try:
        gone, _ = psutil.wait_procs([child], timeout=60)  # well inside its 120 s sleep
        assert gone, "the orphaned child outlived its parent"
    finally:
        if child.is_running():
            child.kill()
