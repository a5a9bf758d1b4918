# ObjectCache developer entry points. Everything a test needs is installed here.
PYTHON ?= python3
VENV := .venv
AWS_VENV := .venv-aws
# aws-cli pins its own botocore, which need not match aiobotocore's: it gets its own environment.
AWSCLI_SPEC ?= awscli>=1.44,<2
ARGS ?=
NIXL_SPEC ?= nixl==1.5.1 nixl-cu12==1.5.1

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
AWS_STAMP := $(AWS_VENV)/.installed

.PHONY: serve test bench lint clean venv aws

venv: $(STAMP)
aws: $(AWS_STAMP)

# (Re)create the environment when it is missing or older than pyproject.toml.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	# The rdma transport's NIXL engine (UCX bundled; runs without CUDA). Its metadata demands torch and
	# every CUDA flavour, so it is installed without dependencies.
	$(BIN)/python -m pip install -q --no-deps $(NIXL_SPEC)
	@touch $@

$(AWS_STAMP): Makefile
	@test -x $(AWS_VENV)/bin/python || $(PYTHON) -m venv $(AWS_VENV)
	$(AWS_VENV)/bin/python -m pip install -q --upgrade pip
	$(AWS_VENV)/bin/python -m pip install -q '$(AWSCLI_SPEC)'
	@touch $@

serve: $(STAMP) $(AWS_STAMP)
	$(BIN)/objectcache serve $(ARGS)

test: $(STAMP) $(AWS_STAMP)
	TEST_AWS_CLI=$(abspath $(AWS_VENV))/bin/aws $(BIN)/python -m pytest $(ARGS)

bench: $(STAMP)
	$(BIN)/objectcache bench $(ARGS)

clean:
	rm -rf $(VENV) $(AWS_VENV) .pytest_cache .hypothesis
