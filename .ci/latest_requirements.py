"""Print medadapt's requirements (core + [dev]) with every upper bound removed, for `bash .ci/run --latest`.

The point of the check is to install the newest published releases, including the ones pyproject.toml's upper
bounds exclude, so the next breaking release is seen in CI before users see it. Standard library only: it runs
in a bare virtual environment before anything is installed. ``--lock-header`` prints constraints.txt's header.
"""

import datetime
import platform
import re
import sys
import tomllib
from pathlib import Path

UPPER = re.compile(r"^\s*(<|<=|~=|!=|==)")


def unbounded(requirement: str) -> str:
    """``"peft>=0.13,<0.22"`` -> ``"peft>=0.13"`` (extras and markers kept; ``==``/``~=``/``<`` clauses dropped)."""
    spec, _, marker = requirement.partition(";")
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+(\[[^\]]*\])?)\s*(.*)$", spec)
    if m is None:
        raise SystemExit(f"cannot parse requirement {requirement!r}")
    name, clauses = m.group(1), [c.strip() for c in m.group(3).split(",") if c.strip()]
    kept = ",".join(c for c in clauses if not UPPER.match(c))
    return name + kept + (f"; {marker.strip()}" if marker else "")


def main() -> None:
    if sys.argv[1:] == ["--lock-header"]:
        print("# The exact set of packages CI last passed with (pip constraints file; used by the README's two "
              "set-up commands).")
        print(f"# Resolved on {datetime.date.today()} in a fresh virtual environment: CPython "
              f"{platform.python_version()}, {platform.system()} {platform.machine()}, torch CPU build.")
        print("# Refresh: bash .ci/run --latest --write-lock (docs/install.md). Other Pythons/platforms: install "
              "without -c.")
        return
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        print(unbounded(requirement))


if __name__ == "__main__":
    main()
