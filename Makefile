PYTHON ?= python3
VENV   := venv
BIN    := $(VENV)/bin
STACK  ?= prod
BASE   ?= HEAD
# SET="KEY.PATH=VALUE …": what-if overrides; SECRETS="api_key …": plan as if these Pulumi secrets were set
SET     ?=
SECRETS ?=
PLAN_FLAGS = $(foreach s,$(SET),--set $(s)) $(foreach s,$(SECRETS),--assume-secret $(s))

.PHONY: venv test lint typecheck unit plan diff bench up

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	touch $@

## make test: lint, type-check against the SDKs' hints, then every test
test: venv lint typecheck unit

lint: venv
	$(BIN)/python -m ruff check .

typecheck: venv
	$(BIN)/python -m mypy

unit: venv
	$(BIN)/python -m pytest

## make plan STACK=prod: the offline launch plan of a stack
plan: venv
	$(BIN)/python -m stacks plan $(STACK) $(PLAN_FLAGS)

## make diff STACK=prod BASE=origin/main: what the working tree's change does to the stack's plan
diff: venv
	$(BIN)/python -m stacks diff $(STACK) --base $(BASE) $(foreach s,$(SECRETS),--assume-secret $(s))

## make up STACK=prod: pulumi up under the deploy lock the group supervisor takes too (docs/group-restart.md)
up:
	flock /run/lock/vllm-cluster-$(STACK).lock pulumi up -s $(STACK)

bench: venv
	$(BIN)/python bench/plan_scale.py
