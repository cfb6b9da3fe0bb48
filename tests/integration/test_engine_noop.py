"""A no-op `gpuenv build` on a real engine: the plan (gpuenv/building/plan.py) is the only source of
"up to date", so an up-to-date cell says `cached`, and another image behind a cell's tag is
rebuilt, never reported as up to date."""

from __future__ import annotations

import json

import pytest
from support.cells import BASE_IMAGE, CPU_CELL, SHIPPED_MATRIX, TEST_REPOSITORY_PREFIX

pytestmark = pytest.mark.engine


def _statuses(proc) -> list[str]:
    return [r["status"] for r in json.loads(proc.stdout)["results"]]


def test_an_up_to_date_cell_says_cached(shipped_cpu, gpuenv):
    table = gpuenv("build", "-f", str(SHIPPED_MATRIX), CPU_CELL)
    assert CPU_CELL in table.stdout and "cached" in table.stdout, table.stdout
    answer = gpuenv("build", "--json", "-f", str(SHIPPED_MATRIX), CPU_CELL)
    assert _statuses(answer) == ["cached"]


def test_another_image_behind_the_tag_is_rebuilt(write_test_matrix, shipped_cpu, gpuenv, docker):
    matrix = write_test_matrix(variants=("cpu",))  # the shipped install step: layers cached
    cell = f"{TEST_REPOSITORY_PREFIX}/tf:{CPU_CELL}"
    gpuenv("build", "-f", str(matrix))
    assert _statuses(gpuenv("build", "--json", "-f", str(matrix))) == ["cached"]
    docker("tag", BASE_IMAGE, cell)  # not the image the plan built
    assert _statuses(gpuenv("build", "--json", "-f", str(matrix))) == ["built"]
    assert _statuses(gpuenv("build", "--json", "-f", str(matrix))) == ["cached"]
