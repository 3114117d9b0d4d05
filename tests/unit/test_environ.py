"""mini_sglang.environ: the one registry of environment variables the package reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mini_sglang.environ import EnvBool, EnvFloat, EnvInt, EnvStr, envs, markdown_table

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mini_sglang"
REGISTRY = {var.name: var for var in envs}

# Any way of reading the process environment.
READ = re.compile(r"\bos\.environ\b|\bgetenv\(|\bfrom os import\b[^\n]*\benviron\b|\benviron\[")
PROJECT_NAME = re.compile(r"['\"]((?:MINI_)?SGLANG_[A-Z0-9_]+)['\"]")
# (module path, variable) pairs read outside the registry on purpose, each with its reason.
ALLOWED_DIRECT_READS: set[tuple[str, str]] = set()


def _sources() -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(ROOT)), p.read_text())
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "environ.py"
    ]


def test_no_module_reads_the_environment_outside_the_registry():
    offenders = []
    for path, text in _sources():
        for lineno, line in enumerate(text.splitlines(), 1):
            if READ.search(line):
                names = PROJECT_NAME.findall(line) or ["?"]
                offenders += [
                    f"{path}:{lineno}: {line.strip()}"
                    for name in names
                    if (path, name) not in ALLOWED_DIRECT_READS
                ]
    assert not offenders, "read these through mini_sglang.environ:\n" + "\n".join(offenders)


def test_every_project_variable_named_in_the_package_is_registered():
    # A SGLANG_*/MINI_SGLANG_* name in a string literal is a variable the package reads or
    # documents; each must be in the registry (so the registry covers every read).
    missing = {
        f"{path}: {name}"
        for path, text in _sources()
        for name in PROJECT_NAME.findall(text)
        if name not in REGISTRY
    }
    assert not missing, sorted(missing)


def test_every_registry_attribute_used_exists():
    used = {name for _, text in _sources() for name in re.findall(r"\benvs\.(\w+)", text)}
    assert used - set(REGISTRY) == set()
    assert set(REGISTRY) - used == set(), "registered but never read"


def test_registry_entries_are_documented_and_typed():
    for name, var in REGISTRY.items():
        assert var.name == name and var.doc and "\n" not in var.doc
        assert isinstance(var, (EnvStr, EnvInt, EnvFloat, EnvBool))


def test_docs_table_matches_registry():
    doc = (ROOT / "docs" / "environment.md").read_text()
    assert markdown_table() in doc, "regenerate with: python -m mini_sglang.environ"


def test_get_reads_at_call_time_with_each_type(monkeypatch):
    var = envs.SGLANG_RETRACT_DECODE_STEPS
    monkeypatch.delenv(var.name, raising=False)
    assert var.get() == 20 and not var.is_set()
    monkeypatch.setenv(var.name, "7")
    assert var.get() == 7 and var.is_set()
    monkeypatch.setenv(var.name, "seven")
    with pytest.raises(ValueError, match="SGLANG_RETRACT_DECODE_STEPS='seven'"):
        var.get()
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2.5")
    assert envs.SGLANG_HEALTH_CHECK_TIMEOUT.get() == 2.5
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", "")
    assert envs.SGLANG_TORCH_PROFILER_DIR.get() == ""


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        # switches: on only for exactly "1"
        ("MINI_SGLANG_DISABLE_PDL", None, False),
        ("MINI_SGLANG_DISABLE_PDL", "1", True),
        ("MINI_SGLANG_DISABLE_PDL", "true", False),
        # SGLang's profiler switch: true/1, case-insensitive; default on
        ("SGLANG_PROFILE_WITH_STACK", None, True),
        ("SGLANG_PROFILE_WITH_STACK", "TRUE", True),
        ("SGLANG_PROFILE_WITH_STACK", "0", False),
        ("SGLANG_PROFILE_WITH_STACK", "yes", False),
        # tri-state: unset -> None (the backend decides), "true" forces on, else off
        ("SGLANG_FLASHINFER_USE_TENSOR_CORE", None, None),
        ("SGLANG_FLASHINFER_USE_TENSOR_CORE", "True", True),
        ("SGLANG_FLASHINFER_USE_TENSOR_CORE", "1", False),
    ],
)
def test_bool_semantics(monkeypatch, name, raw, expected):
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    assert REGISTRY[name].get() is expected
