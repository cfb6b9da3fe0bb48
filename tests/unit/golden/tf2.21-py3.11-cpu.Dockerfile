# Rendered by gpuenv for cell tf2.21-py3.11-cpu; edit matrix.yaml or images/, not this file.
# tensorflow 2.21.0, Python 3.11, cpu
FROM gpuenv/debian:bookworm

RUN set -eu; \
    export PIP_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/ UV_INDEX_URL=http://127.0.0.1:47812/c7f8d697991d53b5/simple/; \
    mkdir /tmp/gpuenv-uv; \
    python3 -c 'import os, urllib.request as r; r.urlretrieve("http://127.0.0.1:47812/c7f8d697991d53b5/tools/uv/0.13.9/" + os.uname().machine, "/tmp/gpuenv-uv/uv")'; \
    chmod 755 /tmp/gpuenv-uv/uv; \
    useradd --uid 1000 --user-group --create-home --shell /bin/bash gpuenv; \
    /tmp/gpuenv-uv/uv venv --quiet --python python3 /opt/venv; \
    SOURCE_DATE_EPOCH=0 /tmp/gpuenv-uv/uv pip install --quiet --no-cache --compile-bytecode --python /opt/venv/bin/python tensorflow==2.21.0; \
    rm -rf /tmp/gpuenv-uv /root/.cache

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1

LABEL \
    org.opencontainers.image.title="gpuenv/tensorflow:tf2.21-py3.11-cpu" \
    org.opencontainers.image.description="tensorflow 2.21.0, Python 3.11, cpu" \
    org.opencontainers.image.version="tf2.21-py3.11-cpu" \
    org.opencontainers.image.base.name="gpuenv/debian:bookworm" \
    io.gpuenv.cell="tf2.21-py3.11-cpu" \
    io.gpuenv.variant="cpu" \
    io.gpuenv.python="3.11" \
    io.gpuenv.framework="tensorflow" \
    io.gpuenv.framework-version="2.21.0" \
    io.gpuenv.cuda="" \
    io.gpuenv.cudnn=""

USER 1000:1000
WORKDIR /home/gpuenv
CMD ["python"]
