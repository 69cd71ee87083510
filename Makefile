PYTHON ?= python3
VENV   := venv
BIN    := $(VENV)/bin
STACK  ?= prod

.PHONY: venv test lint typecheck unit plan bench up

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
	$(BIN)/python -m stacks plan $(STACK)

## make up STACK=prod: pulumi up under the deploy lock the group supervisor takes too (docs/group-restart.md)
up:
	flock /run/lock/vllm-cluster-$(STACK).lock pulumi up -s $(STACK)

bench: venv
	$(BIN)/python bench/plan_scale.py
