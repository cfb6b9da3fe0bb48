"""Registry names: `--registry REG` (push, kube run) and $GPUENV_REGISTRY (the registry
`gpuenv build` pulls published images from before building) name HOST[:PORT][/NAMESPACE];
an image of the matrix `name: acme/tensorflow` goes to REG/tensorflow:<cell>.
"""

from __future__ import annotations

import os
import re

from gpuenv.matrix.errors import GpuenvError

REGISTRY_ENV = "GPUENV_REGISTRY"  # where `gpuenv build` looks for published images first
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*")


def registry_problem(value: str) -> str | None:
    """Why REG is not HOST[:PORT][/NAMESPACE], or None."""
    if _REGISTRY.fullmatch(value):
        return None
    return f"{value!r}: expected HOST[:PORT][/NAMESPACE] (namespace in lowercase)"


def target_repository(name: str, registry: str | None) -> str:
    """`--registry REG` replaces registry and namespace: REG/<last component of name>."""
    if not registry:
        return name
    return f"{registry.rstrip('/')}/{name.rsplit('/', 1)[-1]}"


def registry_from_env() -> str | None:
    """$GPUENV_REGISTRY, checked; None when unset or empty."""
    value = os.environ.get(REGISTRY_ENV, "").strip()
    if not value:
        return None
    why = registry_problem(value)
    if why:
        raise GpuenvError(f"${REGISTRY_ENV}={why}")
    return value
