"""Package list for setuptools (all other metadata is in pyproject.toml).

pyproject.toml's ``packages.find`` cannot add a package that lives outside its own
prefix, so the list is built here: every ``idemp*`` package, plus ``adapters/`` (and its
subpackages) as ``idemp.adapters``. The folder mapping is ``[tool.setuptools.package-dir]``.
"""

from setuptools import find_packages, setup

packages = find_packages(include=["idemp", "idemp.*"])
packages += ["idemp.adapters"] + [
    f"idemp.adapters.{name}" for name in find_packages(where="adapters")
]

setup(packages=packages)
