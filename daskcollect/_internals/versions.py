"""The ``distributed`` releases the fence was checked against, and the error for an internal that is gone."""

from __future__ import annotations

import warnings
from typing import Any

import distributed
from packaging.version import Version

from daskcollect.errors import DaskVersionError

TESTED = ("2026.1.0", "2026.9.0")  # as pyproject.toml pins it
_warned = False


def check_version() -> None:
    """Warns once if the installed ``distributed`` is outside :data:`TESTED`."""
    global _warned
    installed = Version(distributed.__version__)
    if _warned or Version(TESTED[0]) <= installed < Version(TESTED[1]):
        return
    _warned = True
    warnings.warn(
        f"daskcollect was tested with distributed>={TESTED[0]},<{TESTED[1]} and finds "
        f"{distributed.__version__}. It relies on a few Dask internals (daskcollect._internals); if one "
        "changed you will get a DaskVersionError naming it. Install a tested version to be safe.",
        RuntimeWarning,
        stacklevel=3,
    )


def missing(what: str, exc: BaseException) -> DaskVersionError:
    return DaskVersionError(
        f"daskcollect needs Dask's internal {what}, which distributed {distributed.__version__} does "
        f"not have ({type(exc).__name__}: {exc}). daskcollect was tested with "
        f"distributed>={TESTED[0]},<{TESTED[1]}: install such a version, e.g. "
        f"pip install 'distributed>={TESTED[0]},<{TESTED[1]}'.",
        internal=what,
        version=distributed.__version__,
    )


def attribute(owner: Any, path: str, what: str) -> Any:
    """``owner.<path>`` (a dotted path); a :class:`DaskVersionError` naming ``what`` where it is gone."""
    value = owner
    try:
        for name in path.split("."):
            value = getattr(value, name)
    except AttributeError as exc:
        raise missing(what, exc) from None
    return value


def names(owner: Any, path: str, what: str) -> list[str]:
    """The keys (or items) of ``owner.<path>`` as sorted strings (see :func:`attribute`)."""
    return sorted(map(str, attribute(owner, path, what)))
