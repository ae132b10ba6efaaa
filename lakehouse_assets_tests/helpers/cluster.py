"""A Python for a test cluster's executors: the lakehouse's dependencies, not the lakehouse.

A user's cluster has the project's dependencies installed in its executors'
Python and never the project itself (the session ships it). Here that is a
virtual environment of the same base interpreter whose only path is this
environment's site-packages, added by a ``.pth`` line: the site-packages'
own ``.pth`` files (among them the editable install's finder of
``lakehouse_assets``) are not processed for a path added that way, so the
package cannot be imported from it.
"""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path


def executor_python(folder: Path) -> Path:
    """Create (once) the executors' Python in ``folder``; its interpreter's path."""
    python = folder / "bin" / "python"
    if python.exists():
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target = folder / "lib" / version / "site-packages"
    (target / "lakehouse_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('lakehouse_assets'))"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
        cwd=folder,
    )
    assert found.stdout.strip() == "None", found.stdout
    return python
