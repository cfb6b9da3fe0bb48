"""Layers by change frequency (gpuenv/building/layers.py): one resolution, split into the
framework's closure and the rest, without an engine. The Requires-Dist lines below are TensorFlow
2.21's and its dependencies' own, abridged (their METADATA on PyPI), plus a user's packages."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from rendering import key_of

from gpuenv.building import layers
from gpuenv.building.render import render, templates_digest
from gpuenv.project.lockfile import framework_requirements
from gpuenv.project.snapshot import Settings

H = "--hash=sha256:" + "0" * 64


def block(name: str, version: str) -> str:
    return f"{name}=={version} \\\n    {H}\n"


RESOLUTION = "".join(
    block(n, v)
    for n, v in [
        ("absl-py", "2.3.1"),
        ("certifi", "2026.10.18"),
        ("idna", "3.11"),
        ("numpy", "2.3.5"),
        ("requests", "2.32.5"),
        ("six", "1.17.0"),
        ("tensorflow", "2.21.0"),
        ("tomli-w", "1.2.0"),
        ("typing-extensions", "4.15.0"),
    ]
)
REQUIRES = {
    "tensorflow": [
        "absl-py>=1.0.0",
        "numpy>=1.26.0",
        "requests<3,>=2.21.0",
        "six>=1.12.0",
        'nvidia-cublas-cu12==12.5.3.2; extra == "and-cuda"',
        'typing-extensions>=3.6.6; python_version < "3.8"',
    ],
    "requests": ["idna<4,>=2.5", "certifi>=2017.4.17", 'PySocks!=1.5.7; extra == "socks"'],
    "tomli-w": [],
}


def requires(name: str) -> list[str]:
    return REQUIRES.get(name, [])


def names(text: str) -> list[str]:
    return [n for n, _ in layers.blocks(text)]


def test_the_framework_takes_its_closure_and_the_rest_is_the_users():
    split = layers.split(RESOLUTION, ["tensorflow==2.21.0"], requires, "3.11", "x86_64")
    assert names(split.framework) == [
        "absl-py", "certifi", "idna", "numpy", "requests", "six", "tensorflow",
    ]  # fmt: skip
    # typing-extensions is in the resolution for a user's reason: its TF marker is false.
    assert names(split.packages) == ["tomli-w", "typing-extensions"]


def test_the_two_parts_are_exactly_the_resolution_each_line_once():
    split = layers.split(RESOLUTION, ["tensorflow==2.21.0"], requires, "3.11", "x86_64")
    assert sorted(layers.blocks(split.framework) + layers.blocks(split.packages)) == sorted(
        layers.blocks(RESOLUTION)
    )


def test_extras_are_followed():
    resolution = RESOLUTION + block("nvidia-cublas-cu12", "12.5.3.2")
    plain = layers.split(resolution, ["tensorflow==2.21.0"], requires, "3.11", "x86_64")
    assert "nvidia-cublas-cu12" in names(plain.packages)
    extra = layers.split(resolution, ["tensorflow[and-cuda]==2.21.0"], requires, "3.11", "x86_64")
    assert "nvidia-cublas-cu12" in names(extra.framework)


def test_markers_are_the_cells_python_and_machine():
    reqs = {"jax": ['jaxlib==0.7.2; platform_machine == "aarch64"']}
    resolution = block("jax", "0.7.2") + block("jaxlib", "0.7.2")
    on_arm = layers.split(resolution, ["jax==0.7.2"], lambda n: reqs.get(n, []), "3.11", "aarch64")
    on_x86 = layers.split(resolution, ["jax==0.7.2"], lambda n: reqs.get(n, []), "3.11", "x86_64")
    assert names(on_arm.framework) == ["jax", "jaxlib"]
    assert names(on_x86.framework) == ["jax"] and names(on_x86.packages) == ["jaxlib"]


def test_without_packages_of_its_own_the_rest_is_empty():
    theirs = ("tomli-w", "typing-extensions")
    resolution = "".join(b for n, b in layers.blocks(RESOLUTION) if n not in theirs)
    split = layers.split(resolution, ["tensorflow==2.21.0"], requires, "3.11", "x86_64")
    assert split.packages == "" and split.framework == resolution


def test_requires_dist_is_read_from_the_wheel(tmp_path: Path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        zf.writestr(
            "demo-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: six>=1\n"
            'Requires-Dist: idna; extra == "x"\n\nA description: Requires-Dist: not-a-header\n',
        )
    assert layers.requires_dist(wheel) == ["six>=1", 'idna; extra == "x"']


@pytest.fixture
def cells(write_matrix):
    from gpuenv.catalog import compat
    from gpuenv.matrix import schema as matrix

    text = (
        'name: t/x\nmatrix: {tensorflow: ["2.21"], python: ["3.11"], variant: [cpu, gpu]}\n'
        'bases: {"3.11": {debian: bookworm}}\npackages: {pip: [tomli-w==1.2.0]}\n'
    )
    return {c.variant: c for c in compat.resolve(matrix.load(write_matrix(text))).cells}


def test_a_cell_with_packages_installs_them_last_above_the_cuda_wheels(cells):
    for variant, steps in (("cpu", ["python-env", "packages"]),
                           ("gpu", ["python-env", "cuda", "packages"])):  # fmt: skip
        dockerfile = render(cells[variant], key_of(cells[variant]), None).dockerfile
        mounted = [line.split("source=")[1].split(",")[0] for line in dockerfile.splitlines()
                   if line.startswith("RUN --mount=type=bind")]  # fmt: skip
        assert mounted == steps, variant
        packages = dockerfile[dockerfile.index("source=packages") :].split("\n\n")[0]
        # Its own bytecode only: uv's --compile-bytecode would rewrite the framework's.
        assert "--compile-bytecode" not in packages and "/mnt/compile.py" in packages
    assert framework_requirements(cells["cpu"]) == ["tensorflow==2.21.0"]


def test_dry_run_names_the_first_layer_an_edit_rebuilds(cells, write_matrix):
    """gpuenv build --dry-run: which input changed decides the first layer rebuilt."""
    import json

    from gpuenv.building import plan
    from gpuenv.building.render import BuildContext
    from gpuenv.catalog import compat
    from gpuenv.engine.client import ImageInfo
    from gpuenv.matrix import schema as matrix

    def inputs(text: str) -> dict[str, str]:
        cpu = next(c for c in compat.resolve(matrix.load(write_matrix(text))).cells
                   if c.variant == "cpu")  # fmt: skip
        ctx = BuildContext(cpu, render(cpu, key_of(cpu), None).files)
        return plan.input_digests(ctx, templates_digest(), "sha256:b", None, Settings("t"))

    head = 'name: t/x\nmatrix: {tensorflow: ["2.21"], python: ["3.11"], variant: [cpu]}\n'
    head += 'bases: {"3.11": {debian: bookworm}}\n'
    before = inputs(head + "packages: {pip: [six==1.17.0]}\n")
    image = ImageInfo("sha256:i", labels={"io.gpuenv.inputs": json.dumps(before)})
    for edit, layer in [
        ("packages: {pip: [six==1.17.0, tomli-w==1.2.0]}\n", "packages"),
        ("packages: {pip: [six==1.17.0], apt: [curl]}\n", "apt"),
    ]:
        reasons, first = plan._why_rebuild(image, inputs(head + edit))
        assert first == layer, (edit, reasons)
    # A package edit with its re-lock: still the packages layer; a re-lock alone may move any
    # version the framework needs.
    after = {**inputs(head + "packages: {pip: [six==1.17.0, tomli-w==1.2.0]}\n"), "lock": "x"}
    assert plan._why_rebuild(image, after)[1] == "packages"
    assert plan._why_rebuild(image, {**before, "lock": "x"})[1] == "framework"
    assert plan._why_rebuild(image, {**before, "framework": "x"})[1] == "framework"
    assert plan._why_rebuild(image, {**before, "base": "sha256:c"})[1] == "base"
