"""pyproject.toml, requirements/constraints-py3.*.txt, the Makefile and environment.yml agree."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from support.nbutil import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

# conda-forge package name -> the PyPI name of the same thing
CONDA_TO_PYPI = {"pytorch": "torch", "pytorch-cpu": "torch", "matplotlib-base": "matplotlib"}
CONDA_ONLY = {"python", "pip"}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in pyproject()["project"]["dependencies"]]


def extra_test_requirements() -> list[Requirement]:
    return [Requirement(r) for r in pyproject()["project"]["optional-dependencies"]["test"]]


def constraint_files() -> dict[str, Path]:
    """Python minor version ('3.11') -> its constraints file."""
    files = sorted((REPO / "requirements").glob("constraints-py3.*.txt"))
    return {f.name.removeprefix("constraints-py").removesuffix(".txt"): f for f in files}


def pinned_lines(minor: str) -> list[Requirement]:
    """Every line of `minor`'s file, markers kept (a package may have one line per branch)."""
    reqs = []
    for line in constraint_files()[minor].read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", (
            f"constraints-py{minor}.txt: {line!r} is not an exact `name==version` pin"
        )
        reqs.append(req)
    return reqs


def constraints(minor: str | None = None) -> dict[str, Version]:
    """The pins that apply on this interpreter (its markers evaluated), or on `minor`'s x.y.99."""
    env = None if minor is None else {"python_version": minor, "python_full_version": minor + ".99"}
    minor = minor or "{}.{}".format(*sys.version_info[:2])
    pins = {}
    for req in pinned_lines(minor):
        if req.marker is None or req.marker.evaluate(env):
            name = canonicalize_name(req.name)
            assert name not in pins, f"constraints-py{minor}.txt pins {req.name} twice here"
            pins[name] = Version(next(iter(req.specifier)).version)
    return pins


def makefile_pythons() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return re.search(r"^PYTHONS\s*:=\s*(.*)$", text, re.M).group(1).split()


def environment() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def conda_specs() -> dict[str, str]:
    """environment.yml's conda dependencies: PyPI-style name -> conda version spec ('' if none)."""
    specs = {}
    for dep in environment()["dependencies"]:
        if isinstance(dep, dict):
            continue
        name, version = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", dep.strip()).groups()
        name = CONDA_TO_PYPI.get(name, name)
        specs[canonicalize_name(name)] = version.lstrip("=").split("=")[0]  # drop a build string
    return specs


def conda_python_minors() -> list[str]:
    """The Makefile's PYTHONS that environment.yml's `python` spec (`>=3.11,<3.14`) allows."""
    (spec,) = [d.strip()[len("python"):] for d in environment()["dependencies"]
               if isinstance(d, str) and re.match(r"python\b", d.strip())]
    # conda's `=3.11` means 3.11.*; `>=3.11,<3.14` reads the same in both languages
    allowed = SpecifierSet(f"=={spec[1:]}.*" if spec[:1] == "=" and spec[1:2] != "=" else spec)
    return [m for m in makefile_pythons() if Version(m + ".99") in allowed]


def pip_section() -> list[str]:
    sections = [d["pip"] for d in environment()["dependencies"] if isinstance(d, dict)]
    assert len(sections) == 1, "environment.yml should have exactly one `pip:` section"
    return sections[0]


def test_environment_yml_names_every_runtime_dependency():
    specs = conda_specs()
    missing = [str(r) for r in runtime_requirements() if canonicalize_name(r.name) not in specs]
    assert not missing, f"environment.yml lacks runtime dependencies of pyproject.toml: {missing}"
    assert "torch" not in {d for d in environment()["dependencies"] if isinstance(d, str)}, (
        "conda-forge's package is `pytorch`, not `torch`"
    )


def test_environment_yml_names_nothing_pyproject_does_not():
    runtime = {canonicalize_name(r.name) for r in runtime_requirements()}
    extra = sorted(set(conda_specs()) - runtime - CONDA_ONLY)
    assert not extra, f"environment.yml installs packages pyproject.toml does not declare: {extra}"


def test_environment_yml_installs_shmlab_itself_from_conda_forge():
    assert "pip" in conda_specs(), "list `pip` before the pip section, or conda warns and may skip"
    assert pip_section() == ["-e ."], "the pip section should install only shmlab itself (`-e .`)"
    assert environment()["channels"][0] == "conda-forge"


@pytest.mark.parametrize("minor", conda_python_minors())
def test_environment_yml_pins_match_the_tested_versions(minor):
    """`name=X.Y.*` in environment.yml agrees with the exact pin of every Python it allows."""
    pins = constraints(minor)
    for name, spec in conda_specs().items():
        if name in CONDA_ONLY or not spec:
            continue
        prefix = spec.rstrip("*").rstrip(".")
        assert str(pins[name]).startswith(prefix + ".") or str(pins[name]) == prefix, (
            f"environment.yml pins {name}={spec}, but on Python {minor} the suite ran with "
            f"{name}=={pins[name]}: narrow its `python` range or change the pin"
        )


def test_environment_yml_python_is_a_tested_range():
    """Its `python` range is within requires-python and the Makefile's tested PYTHONS."""
    minors = conda_python_minors()
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    assert minors, "environment.yml's python spec allows none of the Makefile's PYTHONS"
    assert all(Version(m) in requires for m in minors), (minors, str(requires))
    # the range has no hole and goes up to the newest tested Python
    assert minors == makefile_pythons()[makefile_pythons().index(minors[0]):], minors


@pytest.mark.parametrize("minor", sorted(constraint_files()))
@pytest.mark.parametrize("which", ["runtime", "test"])
def test_constraints_pin_every_dependency_within_its_range(which, minor):
    pins = constraints(minor)
    reqs = runtime_requirements() if which == "runtime" else extra_test_requirements()
    for req in reqs:
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints-py{minor}.txt does not pin {req.name}"
        # The CPU wheel's local label (`2.13.0+cpu`) is not part of the pin.
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints-py{minor}.txt pins {req.name}=={pins[name]}, outside pyproject's {req}"
        )


def test_one_constraints_file_per_supported_python():
    """The Makefile's PYTHONS, the files `make lock` writes and requires-python agree."""
    assert sorted(constraint_files(), key=Version) == makefile_pythons()
    requires = SpecifierSet(pyproject()["project"]["requires-python"])
    for minor in makefile_pythons():
        assert Version(minor) in requires, f"Python {minor} vs requires-python {requires}"
    first, last = makefile_pythons()[0], makefile_pythons()[-1]
    assert f"Python {first} to {last}" in (REPO / "README.md").read_text(), (
        "the README should state the tested range"
    )
    assert not (REPO / "requirements" / "constraints.txt").exists(), "one file per Python"


def test_same_torch_everywhere():
    """One torch release on every supported Python, so the notebooks teach one version."""
    versions = {minor: constraints(minor)["torch"] for minor in constraint_files()}
    assert len(set(versions.values())) == 1, versions


def test_reference_set_holds_on_older_patch_levels():
    """A pin that needs a later patch release has a fallback line (Debian 12's 3.11.2)."""
    for minor in constraint_files():
        env = {"python_version": minor, "python_full_version": minor + ".0"}
        names = {canonicalize_name(r.name) for r in pinned_lines(minor)
                 if r.marker is None or r.marker.evaluate(env)}
        for req in runtime_requirements() + extra_test_requirements():
            assert canonicalize_name(req.name) in names, (
                f"constraints-py{minor}.txt has no pin of {req.name} for Python {minor}.0"
            )


def test_constraints_agree_with_what_is_installed():
    """The venv the suite runs in holds exactly the pinned versions (the lock is honest)."""
    from importlib.metadata import PackageNotFoundError, version

    if not (Path(sys.prefix) / ".shmlab-installed").exists():
        pytest.skip("not the venv `make` installs with the pins (conda pins minor versions only)")
    wrong = []
    for name, pinned in constraints().items():
        try:
            installed = Version(version(name))
        except PackageNotFoundError:
            continue  # platform-specific pins (e.g. greenlet, the CUDA build's) need not be
        if Version(installed.public) != pinned:
            wrong.append(f"{name}: pinned {pinned}, installed {installed}")
    assert not wrong, "re-run `make setup` or `make lock`:\n" + "\n".join(wrong)


def test_pyproject_is_consistent():
    project = pyproject()["project"]
    assert project["name"] == "shmlab"
    assert (REPO / project["readme"]).is_file(), "pyproject's readme file is missing"
    assert Version("3.10") in SpecifierSet(project["requires-python"])
    import shmlab

    assert shmlab.__version__ == project["version"], "shmlab.__version__ != pyproject version"
    markers = {m.split(":")[0] for m in pyproject()["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"notebook", "slow", "cuda", "browser"} <= markers
    names = [canonicalize_name(r.name) for r in runtime_requirements()]
    assert len(names) == len(set(names)), "a runtime dependency is listed twice"
