"""Ships ``examples/``, ``wit/`` and the JS SDK ``sdk/javascript/`` inside the wheel (everything else is in pyproject.toml).

A source checkout reads both folders in place; an installed wheel has no checkout, so
``build_py`` copies the inferlet examples (folders with a ``Pie.toml``) and the WIT package into
``pie_core/_bundled/``, where :mod:`pie_core.bundled` finds them. Editable installs skip the
copy: their ``pie_core`` is the checkout's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "node_modules")


class BuildWithBundle(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "pie_core" / "_bundled"
        shutil.rmtree(target, ignore_errors=True)
        for manifest in sorted((ROOT / "examples").glob("*/Pie.toml")):
            shutil.copytree(manifest.parent, target / "examples" / manifest.parent.name, ignore=_SKIP)
        shutil.copytree(ROOT / "wit", target / "wit", ignore=_SKIP)
        shutil.copytree(ROOT / "sdk" / "javascript", target / "sdk" / "javascript", ignore=_SKIP)


setup(cmdclass={"build_py": BuildWithBundle})
