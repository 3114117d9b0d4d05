"""Every command-line script the docs point to answers `--help` with its usage and exit
status 0 on a machine without a GPU, before it checks for a device or reads an argument.

The scripts run as `python SCRIPT --help` would run them (runpy, `__name__ == "__main__"`),
all in one subprocess so torch is imported once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("benchmarks/*.py", "benchmarks/models/*.py", "scripts/*.py")
    for p in ROOT.glob(pattern)
    if p.name != "__init__.py"
)

# Runs each script with --help; prints {script: [exit code, the first line of stdout]}.
DRIVER = r"""
import contextlib, io, json, os, runpy, sys
results = {}
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    out = io.StringIO()
    code = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    results[script] = [code, (out.getvalue().strip().splitlines() or [""])[0]]
print(json.dumps(results))
"""


def test_every_script_prints_its_usage_for_help():
    assert len(SCRIPTS) > 20, SCRIPTS  # the globs still find the scripts
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, *SCRIPTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = {
        script: result
        for script, result in results.items()
        if result[0] not in (0, None) or not result[1].startswith("usage:")
    }
    assert not bad, bad
