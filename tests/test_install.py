"""The install contract: tested bounds in pyproject.toml, the lock CI passes with, and the README's commands."""

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: packages whose releases have broken medadapt or can: each needs a lower and an upper bound
BOUNDED = ["torch", "sentence-transformers", "transformers", "peft", "accelerate", "faiss-cpu", "mteb",
           "langchain-core"]


def _requirements() -> list[Requirement]:
    return [Requirement(r) for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]]


def _lock() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = Version(version)
    return pins


@pytest.mark.parametrize("name", BOUNDED)
def test_breaking_packages_have_lower_and_upper_bounds(name):
    found = [r for r in _requirements() if canonicalize_name(r.name) == name]
    assert found, f"{name} is not a requirement"
    for req in found:
        ops = {spec.operator for spec in req.specifier}
        assert ">=" in ops and "<" in ops, f"{req} needs a lower and an upper bound"


def test_the_lock_pins_every_requirement_inside_its_bounds():
    lock = _lock()
    for req in _requirements():
        name = canonicalize_name(req.name)
        assert name in lock, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(lock[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={lock[name]} outside pyproject's {req.specifier}"
    assert "medadapt" not in lock  # pip refuses a constraint on the package being installed editable


def test_the_readme_commands_use_the_lock_and_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^pip install torch==\S+ && pip install .*$", readme, flags=re.M)
    assert len(commands) == 2, commands
    assert all("-c constraints.txt" in c for c in commands)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()[ci.splitlines().index("  # --- README test command (keep in sync with README.md \"Set-up\") ---") + 1]
    assert "python3 -m venv" in ci and "rm -rf" in ci  # a fresh environment every run, removed afterwards


def test_latest_check_lifts_upper_bounds_only():
    spec = importlib.util.spec_from_file_location("latest_requirements", ROOT / ".ci" / "latest_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.unbounded("peft>=0.13,<0.22") == "peft>=0.13"
    assert module.unbounded("mteb[x]>=2.26,<=2.27 ; python_version >= '3.10'") == \
        "mteb[x]>=2.26; python_version >= '3.10'"
    assert module.unbounded("torch==2.13.0") == "torch"
    for req in _requirements():
        lifted = Requirement(module.unbounded(str(req)))
        assert canonicalize_name(lifted.name) == canonicalize_name(req.name)
        assert all(s.operator in (">=", ">") for s in lifted.specifier), lifted
