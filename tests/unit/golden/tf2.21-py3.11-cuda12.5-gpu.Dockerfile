# Rendered by gpuenv for cell tf2.21-py3.11-cuda12.5-gpu; edit matrix.yaml or images/, not this file.
# tensorflow 2.21.0, Python 3.11, gpu, CUDA 12.5.1, cuDNN 9.3.0.75
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
    SOURCE_DATE_EPOCH=0 /tmp/gpuenv-uv/uv pip install --quiet --no-cache --compile-bytecode --python /opt/venv/bin/python tensorflow==2.21.0; \
    rm -rf /tmp/gpuenv-uv /tmp/gpuenv-ca.pem /root/.cache

RUN set -eu; \
    python3 -c 'import urllib.request as r; r.urlretrieve("http://127.0.0.1:47811/ca.pem", "/tmp/gpuenv-ca.pem")'; \
    export SSL_CERT_FILE=/tmp/gpuenv-ca.pem PIP_CERT=/tmp/gpuenv-ca.pem; \
    export PIP_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/ UV_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/; \
    mkdir /tmp/gpuenv-uv; \
    python3 -c 'import os, urllib.request as r; r.urlretrieve("http://127.0.0.1:47812/c7f8d697991d53b5/tools/uv/0.13.9/" + os.uname().machine, "/tmp/gpuenv-uv/uv")'; \
    chmod 755 /tmp/gpuenv-uv/uv; \
    /tmp/gpuenv-uv/uv pip install --quiet --no-cache --python /opt/venv/bin/python nvidia-cublas-cu12==12.5.3.2 nvidia-cuda-cupti-cu12==12.5.82 nvidia-cuda-nvcc-cu12==12.5.82 nvidia-cuda-nvrtc-cu12==12.5.82 nvidia-cuda-runtime-cu12==12.5.82 nvidia-cudnn-cu12==9.3.0.75 nvidia-cufft-cu12==11.2.3.61 nvidia-curand-cu12==10.3.6.82 nvidia-cusolver-cu12==11.6.3.83 nvidia-cusparse-cu12==12.5.1.3 nvidia-nccl-cu12==2.27.7 nvidia-nvjitlink-cu12==12.5.82; \
    rm -rf /tmp/gpuenv-uv /tmp/gpuenv-ca.pem /root/.cache

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_nvcc/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=12.0" \
    LD_LIBRARY_PATH=/opt/venv/lib/python3.11/site-packages/nvidia/cublas/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_cupti/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cufft/lib:/opt/venv/lib/python3.11/site-packages/nvidia/curand/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusolver/lib:/opt/venv/lib/python3.11/site-packages/nvidia/cusparse/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib:/opt/venv/lib/python3.11/site-packages/nvidia/nvjitlink/lib \
    PYTHONUNBUFFERED=1

LABEL \
    org.opencontainers.image.title="gpuenv/tensorflow:tf2.21-py3.11-cuda12.5-gpu" \
    org.opencontainers.image.description="tensorflow 2.21.0, Python 3.11, gpu, CUDA 12.5.1, cuDNN 9.3.0.75" \
    org.opencontainers.image.version="tf2.21-py3.11-cuda12.5-gpu" \
    org.opencontainers.image.base.name="gpuenv/debian:bookworm" \
    io.gpuenv.cell="tf2.21-py3.11-cuda12.5-gpu" \
    io.gpuenv.variant="gpu" \
    io.gpuenv.python="3.11" \
    io.gpuenv.framework="tensorflow" \
    io.gpuenv.framework-version="2.21.0" \
    io.gpuenv.cuda="12.5" \
    io.gpuenv.cudnn="9.3"

USER 1000:1000
WORKDIR /home/gpuenv
CMD ["python"]
