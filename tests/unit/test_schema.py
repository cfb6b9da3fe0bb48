"""The published JSON Schema of matrix.yaml: in sync with the pydantic models, and the
shipped matrix validates against it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpuenv.matrix import schema as matrix

SCHEMA = Path(matrix.__file__).parents[1] / "data" / "matrix.schema.json"
REGENERATE = ".venv/bin/python -m gpuenv.matrix.schema > gpuenv/data/matrix.schema.json"


def test_schema_file_is_current():
    assert SCHEMA.exists(), f"generate it: {REGENERATE}"
    text = SCHEMA.read_text(encoding="utf-8")
    assert json.loads(text) == matrix.json_schema(), f"out of date; regenerate: {REGENERATE}"
    # Byte for byte what the generator prints, so regenerating gives no spurious diff.
    assert text == json.dumps(matrix.json_schema(), indent=2, sort_keys=True) + "\n"


def test_schema_is_strict():
    schema = matrix.json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "matrix", "bases"}
    for name, definition in schema["$defs"].items():
        if definition.get("type") == "object" and "properties" in definition:
            assert definition.get("additionalProperties") is False, name


def test_shipped_matrix_points_editors_at_the_schema(shipped_matrix):
    first = shipped_matrix.read_text(encoding="utf-8").splitlines()[0]
    found = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert found, first
    assert (shipped_matrix.parent / found.group(1)).resolve() == SCHEMA.resolve()


@pytest.fixture
def validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_shipped_matrix_validates(validator, shipped_matrix):
    data = yaml.safe_load(shipped_matrix.read_text(encoding="utf-8"))
    errors = [e.message for e in validator.iter_errors(data)]
    assert errors == []


def test_design_example_validates(validator):
    # The matrix.yaml example of docs/architecture.md, "matrix.yaml core".
    data = {
        "name": "acme/gpuenv",
        "matrix": {
            "tensorflow": ["2.17", "2.21"],
            "python": ["3.11", "3.13"],
            "variant": ["cpu", "gpu"],
            "exclude": [{"tensorflow": "2.17", "python": "3.13"}],
            "include": [
                {
                    "tensorflow": "2.21",
                    "python": "3.11",
                    "variant": "gpu",
                    "cuda": "12.5",
                    "cudnn": "9.3",
                }
            ],
        },
        "default": {"tensorflow": "2.21", "python": "3.11"},
        "bases": {"3.11": {"debian": "bookworm"}, "3.13": {"debian": "trixie"}},
        "packages": {"pip": ["pandas==2.2.3"], "apt": []},
    }
    assert [e.message for e in validator.iter_errors(data)] == []
    data["bases"]["3.11"] = {"image": "python:3.11-slim-bookworm@sha256:" + "0" * 64}
    assert [e.message for e in validator.iter_errors(data)] == []


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(extra=1),  # unknown key
        lambda d: d["matrix"].update(tensorflow=[2.2]),  # a float version
        lambda d: d["matrix"].update(variant=["tpu"]),
        lambda d: d["bases"].update({"3.11": {"debian": "bookworm", "image": "x"}}),
        lambda d: d.pop("bases"),
    ],
    ids=["unknown-key", "float-version", "variant", "both-base-kinds", "no-bases"],
)
def test_schema_refuses_what_the_loader_refuses(validator, shipped_matrix, change):
    data = yaml.safe_load(shipped_matrix.read_text(encoding="utf-8"))
    change(data)
    assert list(validator.iter_errors(data))
