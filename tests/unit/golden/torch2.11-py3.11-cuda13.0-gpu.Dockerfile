# Rendered by gpuenv for cell torch2.11-py3.11-cuda13.0-gpu; edit matrix.yaml or images/, not this file.
# torch 2.11.0, Python 3.11, gpu, CUDA 13.0.2, cuDNN 9.19.0.56
# Packages from the indexes keyed c7f8d697991d53b5 (uv 0.13.9), fetched and checked by gpuenv on the client;
# the install steps mount them (see partials/macros.j2).

FROM gpuenv/debian:bookworm

RUN --mount=type=bind,source=python-env,target=/mnt \
    --mount=type=secret,id=ca,target=/mnt/ca.pem \
    --mount=type=tmpfs,target=/mnt/bin \
    set -eu; \
    export SOURCE_DATE_EPOCH=1735689600; \
    [ ! -s /mnt/ca.pem ] || export SSL_CERT_FILE=/mnt/ca.pem; \
    if [ -e /mnt/uv ]; then ln -s /mnt/uv /mnt/bin/uv; \
    else python3 -B /mnt/uv.py /mnt/bin/uv; fi; \
    useradd --uid 1000 --user-group --create-home --shell /bin/bash gpuenv; \
    rm -f /etc/passwd- /etc/group- /etc/shadow- /etc/gshadow- /etc/subuid- /etc/subgid-; \
    /mnt/bin/uv venv --quiet --python python3 /opt/venv; \
    if grep -q -e --hash= /mnt/index.txt; then /mnt/bin/uv pip install --no-progress --no-cache --require-hashes --no-deps --python /opt/venv/bin/python -r /mnt/index.txt --compile-bytecode; fi; \
    if grep -q -e --hash= /mnt/requirements.txt; then /mnt/bin/uv pip install --no-progress --no-cache --offline --no-index --find-links /mnt --require-hashes --no-deps --python /opt/venv/bin/python -r /mnt/requirements.txt --compile-bytecode; fi; \
    find /opt/venv -path '*.dist-info/uv_cache.json' -delete; \
    grep -l '/uv_cache\.json,' /opt/venv/lib/python*/site-packages/*.dist-info/RECORD \
        | xargs -r sed -i '/\/uv_cache\.json,/d'; \
    rm -rf /root/.cache

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0" \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusparselt/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nvshmem/lib \
    PYTHONUNBUFFERED=1

LABEL \
    org.opencontainers.image.title="acme/gpuenv:torch2.11-py3.11-cuda13.0-gpu" \
    org.opencontainers.image.description="torch 2.11.0, Python 3.11, gpu, CUDA 13.0.2, cuDNN 9.19.0.56" \
    org.opencontainers.image.version="torch2.11-py3.11-cuda13.0-gpu" \
    org.opencontainers.image.base.name="gpuenv/debian:bookworm" \
    io.gpuenv.cell="torch2.11-py3.11-cuda13.0-gpu" \
    io.gpuenv.variant="gpu" \
    io.gpuenv.python="3.11" \
    io.gpuenv.framework="torch" \
    io.gpuenv.framework-version="2.11.0" \
    io.gpuenv.cuda="13.0" \
    io.gpuenv.cudnn="9.19"

USER 1000:1000
WORKDIR /home/gpuenv
CMD ["python"]
