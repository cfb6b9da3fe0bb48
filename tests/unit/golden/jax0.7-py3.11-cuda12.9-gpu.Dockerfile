# Rendered by gpuenv for cell jax0.7-py3.11-cuda12.9-gpu; edit matrix.yaml or images/, not this file.
# jax 0.7.2, Python 3.11, gpu, CUDA 12.9.1, cuDNN 9.10.2.21
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
    SOURCE_DATE_EPOCH=0 /tmp/gpuenv-uv/uv pip install --quiet --no-cache --compile-bytecode --python /opt/venv/bin/python jax==0.7.2; \
    rm -rf /tmp/gpuenv-uv /tmp/gpuenv-ca.pem /root/.cache

RUN set -eu; \
    python3 -c 'import urllib.request as r; r.urlretrieve("http://127.0.0.1:47811/ca.pem", "/tmp/gpuenv-ca.pem")'; \
    export SSL_CERT_FILE=/tmp/gpuenv-ca.pem PIP_CERT=/tmp/gpuenv-ca.pem; \
    export PIP_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/ UV_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/; \
    mkdir /tmp/gpuenv-uv; \
    python3 -c 'import os, urllib.request as r; r.urlretrieve("http://127.0.0.1:47812/c7f8d697991d53b5/tools/uv/0.13.9/" + os.uname().machine, "/tmp/gpuenv-uv/uv")'; \
    chmod 755 /tmp/gpuenv-uv/uv; \
    /tmp/gpuenv-uv/uv pip install --quiet --no-cache --python /opt/venv/bin/python jax-cuda12-pjrt==0.7.2 jax-cuda12-plugin==0.7.2 nvidia-cublas-cu12==12.9.1.4 nvidia-cuda-cupti-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 nvidia-cudnn-cu12==9.10.2.21 nvidia-cufft-cu12==11.4.1.4 nvidia-cusolver-cu12==11.7.5.82 nvidia-cusparse-cu12==12.5.10.65 nvidia-nccl-cu12==2.27.5 nvidia-nvjitlink-cu12==12.9.86 nvidia-nvshmem-cu12==3.3.20; \
    rm -rf /tmp/gpuenv-uv /tmp/gpuenv-ca.pem /root/.cache

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_nvcc/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=12.0" \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cublas/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_cupti/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cufft/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusolver/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusparse/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nvjitlink/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nvshmem/lib \
    PYTHONUNBUFFERED=1

LABEL \
    org.opencontainers.image.title="acme/gpuenv:jax0.7-py3.11-cuda12.9-gpu" \
    org.opencontainers.image.description="jax 0.7.2, Python 3.11, gpu, CUDA 12.9.1, cuDNN 9.10.2.21" \
    org.opencontainers.image.version="jax0.7-py3.11-cuda12.9-gpu" \
    org.opencontainers.image.base.name="gpuenv/debian:bookworm" \
    io.gpuenv.cell="jax0.7-py3.11-cuda12.9-gpu" \
    io.gpuenv.variant="gpu" \
    io.gpuenv.python="3.11" \
    io.gpuenv.framework="jax" \
    io.gpuenv.framework-version="0.7.2" \
    io.gpuenv.cuda="12.9" \
    io.gpuenv.cudnn="9.10"

USER 1000:1000
WORKDIR /home/gpuenv
CMD ["python"]
