"""The production engine and the unit tests' fake both satisfy EngineProtocol.

Checked twice: mypy (scripts/test.sh runs it on this file and on fake_engine.py) holds
both classes to every member's full signature through the `type[EngineProtocol]`
assignments below; pytest checks at run time that each member exists on both with the
same parameters (names, kinds, defaults), so the check holds where mypy is not run.
"""

from __future__ import annotations

import inspect

import pytest
from fake_engine import FakeEngine

from gpuenv.engine.client import Engine
from gpuenv.engine.protocol import EngineProtocol

# The static check: mypy reports either line if the class does not satisfy the Protocol.
PRODUCTION: type[EngineProtocol] = Engine
FAKE: type[EngineProtocol] = FakeEngine

MEMBERS = sorted(
    name
    for name, value in vars(EngineProtocol).items()
    if not name.startswith("_") and (callable(value) or isinstance(value, property))
)


def _parameters(function: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_protocol_lists_the_engine_operations() -> None:
    assert {"image", "pull", "create", "attach", "wait", "remove_container", "url"} <= set(MEMBERS)


@pytest.mark.parametrize("cls", [Engine, FakeEngine], ids=["Engine", "FakeEngine"])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_engine_has_each_member_with_its_parameters(cls: type, name: str) -> None:
    wanted = inspect.getattr_static(EngineProtocol, name)
    assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
    got = inspect.getattr_static(cls, name)
    if isinstance(wanted, property):  # a property or a plain attribute both satisfy it
        assert not callable(got) or isinstance(got, property), f"{cls.__name__}.{name}"
        return
    assert callable(got), f"{cls.__name__}.{name} is not a method"
    assert _parameters(got) == _parameters(wanted), f"{cls.__name__}.{name}'s parameters"
