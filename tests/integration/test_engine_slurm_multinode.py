"""Multi-node that talks (issue 46, item 3), on the Slurm lab whose nodes are separate hosts
(support/slurm_cluster.py: each slurmd in a network namespace of its own, reachable only at
its NodeAddr; node to node through a bridge).

One two-node job in the image of the suite's smallest framework cell (JAX 0.7 on CPU,
locked with the suite's date, so the engine's layer cache builds it in seconds): its two
tasks rendezvous over what gpuenv sets (MASTER_ADDR, MASTER_PORT, SLURM_PROCID/NTASKS)
with jax.distributed.initialize, and psum across both processes over gloo's TCP
collectives; each rank checks the sum. Then one job whose second node dies (its slurmd and
its tasks killed): gpuenv names the node, exits non-zero, and no task is left on either
node. The node is restored after.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import JAX_CPU_CELL, JAX_LOCK_DATE, jax_cpu_matrix, test_repository
from support.cli import GPUENV, clean_env, gpuenv_cmd
from support.slurm_cluster import MARKER, SlurmCluster, marked_pids, slurm_cluster

pytestmark = pytest.mark.engine

NAME = test_repository("slurm-jax")
IMAGE = f"{NAME}:{JAX_CPU_CELL}"
MARKED = ("-e", MARKER, "-e", "GPUENV_SLURM_TEST")

# Gloo is jax 0.7's default for CPU collectives across processes (the job without the
# config line gave the same sums); named so that the test says which collectives ran.
ALL_REDUCE = """\
import os
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
jax.distributed.initialize(
    coordinator_address=f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    num_processes=size, process_id=rank)
import jax.numpy as jnp
total = float(jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(jnp.array([rank + 1.0]))[0])
want = size * (size + 1) / 2
assert total == want, (total, want)
print(f"{os.environ['SLURMD_NODENAME']} rank {rank} of {jax.process_count()}: sum {total} "
      f"via {os.environ['MASTER_ADDR']}", flush=True)
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[SlurmCluster]:
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def jax_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The JAX CPU cell, locked and built as the other modules do (the layer cache)."""
    project = tmp_path_factory.mktemp("jax-cell")
    (project / "matrix.yaml").write_text(jax_cpu_matrix(NAME))
    env = clean_env(XDG_CACHE_HOME=str(project / "cache"))
    gpuenv_cmd("lock", "--exclude-newer", JAX_LOCK_DATE, cwd=project, env=env)
    gpuenv_cmd("build", JAX_CPU_CELL, cwd=project, env=env)
    try:
        yield IMAGE
    finally:
        subprocess.run(["docker", "rmi", IMAGE], capture_output=True, check=False)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared")


def slurm_run(lab: SlurmCluster, work: Path, shared: Path, image: str, tag: str,
              *command: str) -> subprocess.Popen[str]:  # fmt: skip
    argv = [*GPUENV, "run", "--slurm", "-i", image, "--shared", str(shared), *MARKED,
            "--nodes", "2", "--time", "5", "--", *command]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=work, env=lab.env(GPUENV_SLURM_TEST=tag))  # fmt: skip


def test_two_nodes_all_reduce_over_gloo(lab, jax_image, shared, tmp_path):
    (tmp_path / "all_reduce.py").write_text(ALL_REDUCE)
    proc = slurm_run(lab, tmp_path, shared, jax_image, uuid.uuid4().hex, "python",
                     "all_reduce.py")  # fmt: skip
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    via = lab.net.node_addr("n1")  # the first node's NodeAddr: its name resolves nowhere
    assert sorted(out.splitlines()) == [
        f"n1 rank 0 of 2: sum 3.0 via {via}",
        f"n2 rank 1 of 2: sum 3.0 via {via}",
    ], err


def test_a_node_that_dies_is_named_and_leaves_no_task(lab, jax_image, shared, tmp_path):
    tag = uuid.uuid4().hex
    proc = slurm_run(lab, tmp_path, shared, jax_image, tag, "sleep", "300")
    try:
        deadline = time.monotonic() + 300  # the SquashFS, if the test above did not run
        while not all(set(lab.on_node(n)) & set(marked_pids(f"GPUENV_SLURM_TEST={tag}"))
                      for n in ("n1", "n2")):  # fmt: skip
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        killed = time.monotonic()
        lab.kill_node("n2")
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed
        assert proc.returncode != 0, f"{out}\n{err}"
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: job ") and "Slurm lost node n2 (" in last, err
        assert marked_pids(f"GPUENV_SLURM_TEST={tag}") == [], "a task outlived the job"
        print(f"gpuenv ended {took:.1f} s after the node died: {last}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        lab.restore_node("n2")
