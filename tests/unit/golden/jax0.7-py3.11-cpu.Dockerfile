# Rendered by gpuenv for cell jax0.7-py3.11-cpu; edit matrix.yaml or images/, not this file.
# jax 0.7.2, Python 3.11, cpu
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

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1

LABEL \
    org.opencontainers.image.title="acme/gpuenv:jax0.7-py3.11-cpu" \
    org.opencontainers.image.description="jax 0.7.2, Python 3.11, cpu" \
    org.opencontainers.image.version="jax0.7-py3.11-cpu" \
    org.opencontainers.image.base.name="gpuenv/debian:bookworm" \
    io.gpuenv.cell="jax0.7-py3.11-cpu" \
    io.gpuenv.variant="cpu" \
    io.gpuenv.python="3.11" \
    io.gpuenv.framework="jax" \
    io.gpuenv.framework-version="0.7.2" \
    io.gpuenv.cuda="" \
    io.gpuenv.cudnn=""

USER 1000:1000
WORKDIR /home/gpuenv
CMD ["python"]
