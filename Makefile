PYTHON ?= python3
VENV   := venv
BIN    := $(VENV)/bin
STACK  ?= prod
BASE   ?= HEAD
# SET="KEY.PATH=VALUE …": what-if overrides; SECRETS="api_key …": plan as if these Pulumi secrets were set
SET     ?=
SECRETS ?=
PLAN_FLAGS = $(foreach s,$(SET),--set $(s)) $(foreach s,$(SECRETS),--assume-secret $(s))

# pytest-xdist processes for `make test`; most tests wait on subprocesses, nginx, Docker or Ray, so more workers
# than cores still pays. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 4

.PHONY: venv venv-plan services test lint typecheck unit plan diff bench up toolchain lab

## One virtualenv, venv/ (Pulumi.yaml runs the program from it), installed in two stages:
## planning needs only requirements-plan.txt; tests, lint and the Pulumi program need the rest.
venv-plan: $(VENV)/.plan-installed
venv: $(VENV)/.installed

$(VENV)/.plan-installed: requirements-plan.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  echo "cannot create $(VENV)/ with $(PYTHON) -m venv: on Debian, apt-get install python3-venv" >&2; exit 2; }
	@echo "venv: installing what planning needs into $(VENV)/ (pydantic, PyYAML, ruamel.yaml)..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-plan.txt
	@touch $@

$(VENV)/.installed: $(VENV)/.plan-installed requirements.txt requirements-dev.txt
	@echo "venv: installing the Pulumi SDKs and the test tools into $(VENV)/ (torch, Ray, moto...): a few minutes the first time..."
	@$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	@touch $@

## make services: the Debian packages and the Docker engine the tests use (root; installs what is missing)
services:
	@scripts/test-services.sh

## make test: the machine's test services, lint, type-check against the SDKs' hints, then every test
test: services venv lint typecheck unit

lint: venv
	$(BIN)/python -m ruff check .

typecheck: venv
	$(BIN)/python -m mypy

unit: venv
	$(BIN)/python -m pytest --ignore=tests/lab $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup)

## make plan STACK=prod: the offline launch plan of a stack
plan: venv-plan
	$(BIN)/python -m stacks plan $(STACK) $(PLAN_FLAGS)

## make diff STACK=prod BASE=origin/main: what the working tree's change does to the stack's plan
diff: venv-plan
	$(BIN)/python -m stacks diff $(STACK) --base $(BASE) $(foreach s,$(SECRETS),--assume-secret $(s))

## make up STACK=prod: pulumi up under the deploy lock the group supervisor takes too (docs/group-restart.md)
up:
	VLLM_CLUSTER_DEPLOY_LOCK_HELD=/run/lock/vllm-cluster-$(STACK).lock \
	  flock /run/lock/vllm-cluster-$(STACK).lock pulumi up -s $(STACK)

bench: venv
	$(BIN)/python bench/plan_scale.py

## make toolchain: the Pulumi CLI, its Python language host and the command and docker plugins, built from Go
## modules into ~/.cache/vllm-cluster/toolchain (toolchain/README.md); the last line printed is their directory
toolchain:
	@bash toolchain/build.sh

## make lab: a lab cluster of network namespaces on this machine, deployed with the real Pulumi CLI: preview, up,
## diff, a failing check, rollback, secrets, policy, refresh and destroy (docs/rehearse.md); tears the lab down
lab: services venv toolchain
	$(BIN)/python -m pytest tests/lab -o addopts="-q -p no:cacheprovider" -o timeout=2400 -n 0
