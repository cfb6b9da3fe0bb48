"""`gpuenv run -v SRC:DST` with a SRC that does not exist: refused before any container,
where Docker's -v would create it on the host, empty and owned by root."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


def test_a_missing_bind_source_is_refused_and_not_created(shipped_cpu, gpuenv, docker, tmp_path):
    missing = tmp_path / f"no-such-{uuid.uuid4().hex[:8]}" / "data"
    before = set(docker("ps", "-aq", "--filter", "label=io.gpuenv.run=1").stdout.split())
    proc = gpuenv("run", "-i", shipped_cpu["cell"], "-v", f"{missing}:/data", "--", "true",
                  check=False)  # fmt: skip
    assert proc.returncode == 125, proc.stderr
    assert proc.stderr.startswith(f"error: -v {missing}:/data: {missing} does not exist")
    assert "Traceback" not in proc.stderr
    assert not Path(missing).exists() and not Path(missing).parent.exists()
    after = set(docker("ps", "-aq", "--filter", "label=io.gpuenv.run=1").stdout.split())
    assert after == before  # no container was created
