"""Where a build's time goes (gpuenv/building/phases.py): BuildKit's plain log read into
phases, as a remote first build's log gives them."""

from __future__ import annotations

import pytest

from gpuenv.building import phases

LOG = """\
#0 building with "default" instance using docker driver

#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 4.21kB done
#1 DONE 0.0s

#2 [internal] load metadata for docker.io/gpuenv/debian:bookworm
#2 DONE 0.1s

#3 [internal] load build context
#3 transferring context: 1.2MB 0.4s done
#3 DONE 0.5s

#4 [1/3] FROM docker.io/gpuenv/debian:bookworm
#4 DONE 0.2s

#5 [2/3] RUN --mount=type=bind,source=python-env,target=/mnt     --mount=type=secret,id=ca
#5 0.412 gpuenv: uv fetched near the engine: uv-0.13.9-py3-none-manylinux.whl (17.4 MB) in 0.93s
#5 1.310 Using Python 3.11.2 environment at: /opt/venv
#5 9.870 Prepared 12 packages in 8.51s
#5 10.10 Installed 12 packages in 228ms
#5 DONE 14.0s

#6 [3/3] RUN --mount=type=bind,source=packages,target=/mnt     --mount=type=secret,id=ca
#6 0.300 Prepared 1 package in 300ms
#6 0.900 Prepared 2 packages in 1m 02s
#6 DONE 70.0s

#7 [3/3] COPY cell.json /etc/gpuenv/cell.json
#7 DONE 0.1s

#8 exporting to image
#8 exporting layers
#8 exporting layers 3.1s done
#8 writing image sha256:0123 done
#8 DONE 3.2s
"""


def test_a_buildkit_log_is_read_into_its_phases():
    log = phases.BuildLog()
    for line in LOG.splitlines():
        log(line)
    got = log.phases()
    assert got == pytest.approx({
        "send": 0.5, "uv": 0.93, "fetch": 8.51 + 0.3 + 62.0,
        "install": (14.0 - 0.93 - 8.51) + (70.0 - 62.3), "steps": 0.3, "export": 3.2,
    })  # fmt: skip


def test_another_builders_log_gives_no_phases():
    log = phases.BuildLog()
    for line in ("Step 2/5 : RUN true", " ---> Running in 0123", "Successfully built 0123"):
        log(line)
    assert set(log.phases().values()) == {0.0}


def test_phases_come_in_their_order_rounded():
    got = phases.ordered({"tag": 0.0123, "probe": 1.0, "context": 2.555, "send": 0.5})
    assert list(got) == ["probe", "context", "send", "tag"]
    assert got["context"] == 2.56 and got["tag"] == 0.01
