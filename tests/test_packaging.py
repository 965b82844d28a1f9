"""Packaging: every package of the tree is in pyproject's explicit list, the top-level
`dashboard/` folder installs as `commtrace.dashboard`, and every third-party module imported by
commtrace or the dashboard is a declared dependency. (scripts/wheel_smoke.sh checks the built
wheel itself in a fresh venv; CI runs it.)"""

from __future__ import annotations

import ast
import os
import sys

from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None


def _pyproject():
    import pytest
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _tree_packages():
    found = set()
    for top, name in (("commtrace", "commtrace"), ("dashboard", "commtrace.dashboard")):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            if "__init__.py" in files:
                rel = os.path.relpath(d, os.path.join(ROOT, top))
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return found


def test_every_package_is_listed_and_dashboard_is_inside_commtrace():
    st = _pyproject()["tool"]["setuptools"]
    assert set(st["packages"]) == _tree_packages()
    assert st["package-dir"] == {"commtrace.dashboard": "dashboard"}
    assert not any(p == "dashboard" or p.startswith("dashboard.") for p in st["packages"])
    assert "assets/*" in st["package-data"]["commtrace.dashboard"]


def test_every_third_party_import_is_declared():
    deps = list(_pyproject()["project"]["dependencies"])
    # An optional feature's extra declares its imports too (the spark extra: pyspark, sqlglot,
    # imported only by commtrace/analysis/spark.py); the test extra is not a runtime one.
    for extra, reqs in _pyproject()["project"].get("optional-dependencies", {}).items():
        if extra != "test":
            deps += reqs
    declared = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in deps}
    # import name -> distribution name
    dist = {"pynvml": "nvidia-ml-py", "yaml": "pyyaml"}
    stdlib = set(sys.stdlib_module_names)
    missing = {}
    for top in ("commtrace", "dashboard"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                path = os.path.join(d, f)
                for node in ast.walk(ast.parse(open(path).read())):
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names = [node.module]
                    else:
                        continue
                    for n in names:
                        mod = n.split(".")[0]
                        if mod in stdlib or mod in ("commtrace", "__future__"):
                            continue
                        if dist.get(mod, mod).lower().replace("_", "-") not in declared:
                            missing.setdefault(mod, os.path.relpath(path, ROOT))
    assert not missing, f"imported but not in pyproject's dependencies: {missing}"


def test_the_dashboard_imports_as_commtrace_dashboard():
    import commtrace.dashboard.app as app
    assert os.path.samefile(os.path.dirname(app.__file__), os.path.join(ROOT, "dashboard"))
    assert os.path.isfile(os.path.join(os.path.dirname(app.__file__), "assets", "plotly-cartesian-4.1.1.min.js"))


def test_built_extensions_are_not_older_than_their_sources():
    """Both C extensions are ``optional = true``: a `pip install -e .` whose C file no longer
    compiles succeeds and keeps the previous build's ``.so`` in the tree, and the tests would
    then run the old C code. A built file older than its source is that case (or a checkout
    that changed the source since the last build): rebuild with `pip install -e . --no-deps`
    and read the compiler's error."""
    import sysconfig
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    stale = []
    for ext in _pyproject()["tool"]["setuptools"]["ext-modules"]:
        built = os.path.join(ROOT, *ext["name"].split(".")) + suffix
        if not os.path.exists(built):
            continue  # not an in-tree (editable) build: nothing can be stale here
        newest = max(os.path.getmtime(os.path.join(ROOT, s)) for s in ext["sources"])
        if os.path.getmtime(built) < newest:
            stale.append(f"{os.path.relpath(built, ROOT)} is older than {', '.join(ext['sources'])}")
    assert not stale, ("stale C build: " + "; ".join(stale)
                       + " (rebuild: pip install -e . --no-deps; if it fails the C does not compile)")


def test_the_sources_accel_builds_are_package_data():
    """`commtrace accel build` compiles sources shipped in the package (accel.SOURCES): each must
    match a package-data pattern, or the wheel lacks it and `accel status` / `accel build` fail
    for every pip-installed user (the wheel smoke test found `_accel_meta.cpp` missing)."""
    import fnmatch

    from commtrace.capture import accel
    pats = _pyproject()["tool"]["setuptools"]["package-data"]["commtrace"]
    pkg = os.path.join(ROOT, "commtrace")
    for src in accel.SOURCES:
        rel = os.path.relpath(src, pkg).replace(os.sep, "/")
        assert any(fnmatch.fnmatch(rel, p) for p in pats), f"{rel} is not in package-data {pats}"
