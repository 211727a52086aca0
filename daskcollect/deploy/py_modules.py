"""``py_modules=``: the user's own modules, shipped to every worker with Dask's ``UploadFile``.

An env constructor or policy defined in the user's own module (not in the
script being run, which cloudpickle sends by value) pickles as a reference to
that module, and a worker without it fails with ``ModuleNotFoundError``.
Ray users pass ``runtime_env={"py_modules": [...]}``; here the same keyword
uploads each module (a ``.py`` file, or a package as a ``.zip``) through a
``distributed.diagnostics.plugin.UploadFile`` worker plugin: every current
worker imports it before any collector is built, and workers that join later
get it too. The plugins go when the collection closes (the files the workers
received stay in their scratch space, as ``Client.upload_file``'s do).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from daskcollect.errors import ConfigurationError

PLUGIN_PREFIX = "daskcollect-upload-"


def resolve(entries: Sequence[Any]) -> list[Path]:
    """The files and package folders that ``py_modules`` names.

    Args:
        entries: Modules, importable module names, or paths to ``.py`` files
            or package folders. A submodule ships its whole top-level package.

    Raises:
        ConfigurationError: For an entry that is none of these.
    """
    if isinstance(entries, (str, os.PathLike, ModuleType)):
        entries = [entries]
    return [_source(entry) for entry in entries]


def _source(entry: Any) -> Path:
    is_path = isinstance(entry, str) and (entry.endswith(".py") or os.sep in entry)
    if isinstance(entry, os.PathLike) or is_path:
        path = Path(entry).resolve()
        if path.is_file() and path.suffix == ".py" or (path / "__init__.py").is_file():
            return path
        raise ConfigurationError(
            f"py_modules entry {str(entry)!r} is neither a .py file nor a package folder "
            "(one with __init__.py). Pass a module, its name, or such a path."
        )
    name = entry.__name__ if isinstance(entry, ModuleType) else entry
    if not isinstance(name, str):
        raise ConfigurationError(
            f"py_modules takes modules, module names or paths, got {type(entry).__name__}."
        )
    top = name.split(".")[0]
    spec = _find(top)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        raise ConfigurationError(
            f"py_modules entry {name!r} cannot be found here (sys.path). Pass an importable module "
            "name, or the path of its .py file or package folder."
        )
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve()


def _find(name: str) -> Any:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def archive(source: Path, folder: str) -> Path:
    """``source`` as Dask can upload it: a ``.py`` file as it is, a package zipped under its name."""
    if source.is_file():
        return source
    target = Path(folder) / f"{source.name}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(source.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, Path(source.name) / path.relative_to(source))
    return target


def ship(handle: Any, sources: Sequence[Path]) -> None:
    """Uploads ``sources`` (as :func:`resolve` returns them) to every worker, now and as workers join.

    Args:
        handle: The collection's :class:`~daskcollect.deploy.handle.ClusterHandle`,
            which removes the plugins when it closes.
        sources: The files and packages.

    Raises:
        ConfigurationError: If a worker fails to import one.
    """
    from distributed.diagnostics.plugin import UploadFile

    with tempfile.TemporaryDirectory(prefix="daskcollect-py-modules-") as folder:
        for source in sources:
            upload = archive(source, folder)
            try:
                handle.register_plugin(UploadFile(str(upload)), name=PLUGIN_PREFIX + upload.name)
            except Exception as exc:
                raise ConfigurationError(
                    f"Shipping {source} to the workers failed: a worker could not import it "
                    f"({type(exc).__name__}: {exc}). Check that it imports on its own, with only "
                    "the packages the workers have."
                ) from exc


def missing_module_hint(exc: BaseException) -> str | None:
    """For a ``ModuleNotFoundError`` on a worker, the fix, naming the module and where it is here."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    spec = _find(top)
    here = f" (here it is {spec.origin})" if spec is not None and spec.origin else ""
    return (
        f"The workers cannot import module {exc.name!r}{here}, which the env constructor or the "
        f"policy comes from. Ship it with DaskCollector(..., py_modules=[{top!r}]), which uploads it "
        "to every worker (and to those that join later), or install it on the workers."
    )
