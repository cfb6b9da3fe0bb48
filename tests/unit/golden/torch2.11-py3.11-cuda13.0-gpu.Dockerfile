# Rendered by gpuenv for cell torch2.11-py3.11-cuda13.0-gpu; edit matrix.yaml or images/, not this file.
# torch 2.11.0, Python 3.11, gpu, CUDA 13.0.2, cuDNN 9.19.0.56
FROM gpuenv/debian:bookworm

RUN set -eu; \
    python3 -c 'import urllib.request as r; r.urlretrieve("http://127.0.0.1:47811/ca.pem", "/tmp/gpuenv-ca.pem")'; \
    export SSL_CERT_FILE=/tmp/gpuenv-ca.pem PIP_CERT=/tmp/gpuenv-ca.pem; \
    export PIP_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/ UV_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/; \
    mkdir /tmp/gpuenv-uv; \
    python3 -c 'import os, urllib.request as r; r.urlretrieve("http://127.0.0.1:47812/c7f8d697991d53b5/tools/uv/0.13.9/" + os.uname().machine, "/tmp/gpuenv-uv/uv")'; \
    chmod 755 /tmp/gpuenv-uv/uv; \
    useradd --uid 1000 --user-group --create-home --shell /bin/bash gpuenv; \
    /tmp/gpuenv-uv/uv venv --quiet --python python3 /opt/venv; \
    SOURCE_DATE_EPOCH=0 /tmp/gpuenv-uv/uv pip install --quiet --no-cache --compile-bytecode --python /opt/venv/bin/python torch==2.11.0 cuda-toolkit==13.0.2 nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.0 nvidia-nccl-cu13==2.28.9 nvidia-nvjitlink==13.0.88 nvidia-nvshmem-cu13==3.4.5 nvidia-nvtx==13.0.85; \
    rm -rf /tmp/gpuenv-uv /tmp/gpuenv-ca.pem /root/.cache

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
