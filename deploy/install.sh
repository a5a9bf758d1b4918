#!/bin/sh
# Lays out what deploy/systemd's units expect (README "Running it as a service"):
#   /opt/objectcache/.venv            ObjectCache installed from this checkout (a wheel built from a
#                                     copy of it: the checkout is only read, so it may be read-only)
#   /etc/objectcache/objectcache.toml the example configuration, if none is there yet (mode 0640)
#   /etc/systemd/system/objectcache-{storage-server,gateway}.service
#   user and group objectcache        (system accounts; the units' StateDirectory= makes /var/lib/objectcache)
# DESTDIR=/some/root stages all of it under that root instead (packaging, tests): no account is
# created and systemd is not reloaded then.
#   PYTHON          the interpreter to build with and base the venv on (python3)
#   BUILD_OPTIONS   extra `pip wheel` options (e.g. --no-build-isolation offline)
#   PIP_OPTIONS     extra `pip install` options for the venv (e.g. --no-index --find-links DIR)
#   VENV_OPTIONS    extra `python -m venv` options; --without-pip skips ensurepip (tens of seconds on a loaded
#                   machine) and installs into the venv with $PYTHON's own pip (pip >= 22.3)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
root=${DESTDIR:-}
python=${PYTHON:-python3}
prefix="$root/opt/objectcache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Build from a copy: setuptools writes objectcache.egg-info and build/ beside the sources it builds.
mkdir "$work/src"
cp -R "$src/pyproject.toml" "$src/README.md" "$src/protocol" "$src/gateway" "$src/storage_server" "$src/client_sdk" \
      "$src/scheduler" "$src/bench" "$src/objectcache" "$work/src/"
"$python" -m pip wheel --quiet --no-deps ${BUILD_OPTIONS:-} --wheel-dir "$work/wheel" "$work/src"

install -d -m 0755 "$root/opt" "$prefix" "$root/etc/objectcache" "$root/etc/systemd/system"
"$python" -m venv ${VENV_OPTIONS:-} "$prefix/.venv"
if [ -x "$prefix/.venv/bin/pip" ]; then
    "$prefix/.venv/bin/python" -m pip install --quiet --upgrade ${PIP_OPTIONS:-} "$work"/wheel/objectcache-*.whl
else
    "$python" -m pip --python "$prefix/.venv/bin/python" install --quiet --upgrade ${PIP_OPTIONS:-} "$work"/wheel/objectcache-*.whl
fi

if [ -e "$root/etc/objectcache/objectcache.toml" ]; then
    echo "install: keeping the existing $root/etc/objectcache/objectcache.toml"
else
    install -m 0640 "$src/deploy/objectcache.example.toml" "$root/etc/objectcache/objectcache.toml"
fi
install -m 0644 "$src/deploy/systemd/objectcache-storage-server.service" "$src/deploy/systemd/objectcache-gateway.service" \
        "$root/etc/systemd/system/"

if [ -z "$root" ]; then
    getent group objectcache >/dev/null || groupadd --system objectcache
    id -u objectcache >/dev/null 2>&1 || useradd --system --gid objectcache --home-dir /var/lib/objectcache \
        --shell /usr/sbin/nologin objectcache
    chgrp objectcache /etc/objectcache/objectcache.toml
    if command -v systemctl >/dev/null 2>&1; then systemctl daemon-reload; fi
    echo "install: done. Put real tenants and keys into /etc/objectcache/objectcache.toml, then"
    echo "         systemctl enable --now objectcache-storage-server objectcache-gateway"
fi
