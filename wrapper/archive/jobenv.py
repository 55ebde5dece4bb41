"""Where a job's environment came from, and its Python packages: facts for the manifest.

Two halves, run by two different processes:

* :func:`claims` runs in the task-prolog, as the job's user, inside the job, with the
  task's environment. It names the loaded environment modules (Lmod / Environment
  Modules: ``LOADEDMODULES``, ``_LMFILES_``), the container (Apptainer / Singularity,
  enroot / pyxis), the conda env or venv, the first Python on the job's ``PATH`` and the
  seeds the job exported. The task-prolog writes them to the user's event file: they are
  the user's claims, good for a manifest, never for a decision.
* :func:`read_packages` runs in the epilog (root) and reads the package set of that
  Python's prefix as the job's user (``osl.child.call_as``), with a deadline, *without
  running anything of the user's*: no interpreter and no pip are started (pip would
  import the site-packages and run their ``.pth`` files). It lists ``*.dist-info`` /
  ``*.egg-info`` and reads each ``METADATA`` header (``Name``, ``Version``) through
  ``osl.files.open_regular`` (no FIFO, device or final symlink; never blocks), at most
  ``METADATA_BYTES`` of it; a conda prefix's ``conda-meta/*.json`` names give the
  ``conda list --export`` lines without opening them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

from wrapper.errors import JobwrapError
from wrapper.osl.child import call_as
from wrapper.osl.users import UserIds

MAX_VALUE = 1024  # characters of one claimed value (a path, a module name)
MAX_ITEMS = 200  # modules, module files, container variables, seeds
MAX_PACKAGES = 5000  # per list (pip, conda)
MAX_ENTRIES = 50000  # directory entries looked at, all folders together
METADATA_BYTES = 16384  # of each METADATA / PKG-INFO: the header comes first

SEED_NAME = re.compile(r"^(?:PYTHONHASHSEED|SEED|[A-Za-z0-9_]*_SEED)$")
CONTAINER_NAMES = ("APPTAINER_CONTAINER", "APPTAINER_NAME", "SINGULARITY_CONTAINER",
                   "SINGULARITY_NAME")
CONTAINER_PREFIXES = ("ENROOT_", "PYXIS_")
PYXIS_OPTION = "SPANK_OPTION_pyxis_"  # SLURM_SPANK__SLURM_SPANK_OPTION_pyxis_container_image
_CONDA_FILE = re.compile(r"^(.+)-([^-]+)-([^-]+)\.json$")
_DIST = re.compile(r"^(.+?)-([^-]+?)(?:-py[\d.]+)?\.(?:dist|egg)-info$")


def _cut(value: str) -> str:
    return value[:MAX_VALUE]


def _is_container(name: str) -> bool:
    return name in CONTAINER_NAMES or name.startswith(CONTAINER_PREFIXES) or PYXIS_OPTION in name


def _split(value: str) -> list[str]:
    return [_cut(v) for v in value.split(":") if v][:MAX_ITEMS]


def claims(env: Mapping[str, str]) -> dict[str, Any]:
    """(The job's user, in the task-prolog.) Where the job's environment came from."""
    container = {name: _cut(value) for name, value in sorted(env.items())
                 if _is_container(name)}
    seeds = {name: _cut(value) for name, value in sorted(env.items())
             if SEED_NAME.fullmatch(name)}
    python = None
    for name in ("python3", "python"):
        found = shutil.which(name, path=env.get("PATH", ""))
        if found:
            python = _cut(os.path.abspath(found))
            break
    return {
        "modules": _split(env.get("LOADEDMODULES", "")),
        "module_files": _split(env.get("_LMFILES_", "")),
        "container": dict(list(container.items())[:MAX_ITEMS]),
        "conda": {"prefix": _cut(env["CONDA_PREFIX"]),
                  "env": _cut(env.get("CONDA_DEFAULT_ENV", ""))} if env.get("CONDA_PREFIX")
        else None,
        "venv": _cut(env["VIRTUAL_ENV"]) if env.get("VIRTUAL_ENV") else None,
        "python": python,
        "seeds": dict(list(seeds.items())[:MAX_ITEMS]),
    }


# A seed's value as the rerun line may export it: a plain token (42, 0x2a, 1234-abc), no
# shell or sbatch syntax, never a path another program would load.
SEED_VALUE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


def _text(value: Any) -> str | None:
    return _cut(value) if isinstance(value, str) else None


def _texts(value: Any) -> list[str]:
    return [_cut(v) for v in value if isinstance(v, str)][:MAX_ITEMS] \
        if isinstance(value, list) else []


def safe_seeds(value: Any) -> dict[str, str]:
    """The seeds a claim may carry into the manifest and the rerun line: names that are
    seeds (``SEED_NAME``) with plain values (``SEED_VALUE``); anything else is dropped."""
    if not isinstance(value, Mapping):
        return {}
    return dict(list({k: v for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                      if isinstance(k, str) and SEED_NAME.fullmatch(k)
                      and isinstance(v, str) and SEED_VALUE.fullmatch(v)}.items())[:MAX_ITEMS])


def sanitize(found: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded ``claims()`` dict, read back from the user's event file: only the keys
    ``claims`` writes, with its bounds, and seeds filtered as at the source. The file is
    the user's, so the record may be forged: nothing else it holds reaches the manifest."""
    container = found.get("container")
    conda = found.get("conda")
    return {
        "modules": _texts(found.get("modules")),
        "module_files": _texts(found.get("module_files")),
        "container": {k: _cut(v) for k, v in list(container.items())[:MAX_ITEMS]
                      if isinstance(k, str) and isinstance(v, str) and _is_container(k)}
        if isinstance(container, Mapping) else {},
        "conda": {"prefix": _text(conda.get("prefix")) or "",
                  "env": _text(conda.get("env")) or ""}
        if isinstance(conda, Mapping) and _text(conda.get("prefix")) else None,
        "venv": _text(found.get("venv")),
        "python": _text(found.get("python")),
        "seeds": safe_seeds(found.get("seeds")),
    }


def prefix_of(found: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, prefix) of the job's Python: its venv, else its conda env, else the prefix
    of the first Python on its PATH (``<prefix>/bin/python3``); None when none is known."""
    conda = found.get("conda")
    if isinstance(found.get("venv"), str) and found["venv"]:
        return "venv", str(found["venv"])
    if isinstance(conda, dict) and isinstance(conda.get("prefix"), str) and conda["prefix"]:
        return "conda", str(conda["prefix"])
    python = found.get("python")
    if isinstance(python, str) and os.path.isabs(python):
        return "python", os.path.dirname(os.path.dirname(python))
    return None


def read_packages(user: UserIds, found: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """The package set of the job's Python, read as ``user`` from its prefix.

    ``{kind, prefix, python_version, site_packages, pip, conda, truncated, error}``:
    ``pip`` lines are ``name==version`` (as ``pip freeze``), ``conda`` lines
    ``name=version=build`` (as ``conda list --export``). Never raises.
    """
    where = prefix_of(found)
    out: dict[str, Any] = {"kind": None, "prefix": None, "python_version": None,
                           "site_packages": [], "pip": [], "conda": [], "truncated": False,
                           "error": ""}
    if where is None:
        out["error"] = "the job's Python is not known (no venv, conda env or python on PATH)"
        return out
    out["kind"], out["prefix"] = where
    try:
        read: dict[str, Any] = call_as(user, _scan, where[1], alarm=max(timeout, 0.1),
                                       timeout=max(timeout, 0.1) + 1.0)
    except JobwrapError as exc:
        out["error"] = f"reading the packages as {user.name} failed: {exc}"
        return out
    out.update(read)
    return out


def _scan(prefix: str) -> dict[str, Any]:
    """(Runs as the job user.) List the prefix's packages; a hung file system ends the
    helper at ``read_packages``'s ``timeout`` (``call_as``'s alarm)."""
    budget = [MAX_ENTRIES]
    sites, version = _site_dirs(prefix, budget)
    pip: dict[str, str] = {}
    for site in sites:
        for name in _names(site, budget):
            if name.endswith((".dist-info", ".egg-info")):
                package = _package(site, name)
                if package is not None:
                    pip.setdefault(package[0].lower(), f"{package[0]}=={package[1]}")
    conda = []
    for name in _names(os.path.join(prefix, "conda-meta"), budget):
        match = _CONDA_FILE.match(name)
        if match:
            conda.append("=".join(match.groups()))
    lines = sorted(pip.values(), key=str.lower)
    truncated = budget[0] <= 0 or len(lines) > MAX_PACKAGES or len(conda) > MAX_PACKAGES
    return {"python_version": version, "site_packages": sites, "pip": lines[:MAX_PACKAGES],
            "conda": sorted(conda)[:MAX_PACKAGES], "truncated": truncated,
            "error": "" if sites or conda else f"no site-packages under {prefix}"}


def _names(folder: str, budget: list[int]) -> list[str]:
    """Up to what is left of ``budget`` names in ``folder``; none when it is unreadable."""
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if budget[0] <= 0:
                    break
                budget[0] -= 1
                names.append(entry.name)
    except OSError:
        return []
    return sorted(names)


def _site_dirs(prefix: str, budget: list[int]) -> tuple[list[str], str | None]:
    sites: list[str] = []
    version = None
    for lib in ("lib", "lib64"):
        for name in _names(os.path.join(prefix, lib), budget):
            if not re.fullmatch(r"python3(?:\.\d+)?", name):
                continue
            if name != "python3":
                version = version or name[len("python"):]
            for leaf in ("site-packages", "dist-packages"):
                path = os.path.join(prefix, lib, name, leaf)
                if os.path.isdir(path) and os.path.realpath(path) not in map(
                        os.path.realpath, sites):
                    sites.append(path)
    return sites, version


def _package(site: str, name: str) -> tuple[str, str] | None:
    """(Name, Version) of one ``*.dist-info`` / ``*.egg-info``: from its METADATA (or
    PKG-INFO) header, else from the folder's name."""
    from wrapper.osl.files import UnsafeFileError, open_regular

    path = os.path.join(site, name)
    header: dict[str, str] = {}
    for leaf in ("METADATA", "PKG-INFO"):
        target = path if name.endswith(".egg-info") and os.path.isfile(path) and \
            not os.path.islink(path) else os.path.join(path, leaf)
        try:
            fd = open_regular(target)
        except (OSError, UnsafeFileError):
            continue
        try:
            text = os.read(fd, METADATA_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        finally:
            os.close(fd)
        for line in text.splitlines():
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            if sep and key in ("Name", "Version"):
                header.setdefault(key, value.strip()[:200])
        break
    match = _DIST.match(name)
    package = header.get("Name") or (match.group(1) if match else "")
    version = header.get("Version") or (match.group(2) if match else "")
    return (package, version) if package and version else None
