# ObjectCache: `objectcache serve` (gateway + storage server) as a non-root user.
#   docker build -t objectcache .
#   docker run -p 9000:9000 -v objectcache-data:/var/lib/objectcache objectcache
# Configuration: mount a TOML file and pass --config, or set OBJECTCACHE_* variables
# (OBJECTCACHE_TENANTS=name:access_key:secret_key). The shm transport needs the serving engine
# on the same host and the data volume (which holds the hand-over socket) shared with it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

RUN groupadd --system objectcache && useradd --system --gid objectcache --home-dir /var/lib/objectcache objectcache \
    && install -d -o objectcache -g objectcache -m 0755 /var/lib/objectcache

WORKDIR /opt/objectcache
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY gateway gateway
COPY storage_server storage_server
COPY client_sdk client_sdk
COPY scheduler scheduler
COPY bench bench
COPY objectcache objectcache
RUN pip install .

USER objectcache
ENV OBJECTCACHE_STORE_DATA_DIR=/var/lib/objectcache \
    OBJECTCACHE_GATEWAY_HOST=0.0.0.0 \
    OBJECTCACHE_GATEWAY_PORT=9000 \
    OBJECTCACHE_LOG_FORMAT=json
VOLUME ["/var/lib/objectcache"]
EXPOSE 9000
# Liveness: the gateway answers GET /health without credentials (slim images have no curl).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9000/health', timeout=2).status != 200)"]
# serve stops on SIGTERM: the gateway drains (gateway.drain_timeout_s), then the storage server stops.
STOPSIGNAL SIGTERM
CMD ["objectcache", "serve"]
