# RollArt: one set-up command, one test command, one command that runs the main job.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROTOS := $(wildcard protos/rollart/v1/*.proto)

.PHONY: setup protos test test-fast lint bench run up down clean images compose-smoke

## setup: system packages (apt), .venv with libs + every service + dev tools, Node.js interop client deps.
setup:
	bash scripts/setup.sh

## protos: regenerate the committed Python stubs in libs/rollart/v1 from protos/.
protos:
	$(PY) -m grpc_tools.protoc -I protos --python_out=libs --pyi_out=libs --grpc_python_out=libs $(PROTOS)
	@touch libs/rollart/v1/__init__.py

## test: lint, then the whole suite (unit, integration with real processes, e2e, faults).
test: lint
	$(VENV)/bin/pytest -q

## test-fast: skip tests marked slow.
test-fast:
	$(VENV)/bin/pytest -q -m "not slow"

## lint: ruff, then mypy over libs/, every service package and the devtools (settings in mypy.ini).
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

## bench: list the benchmarks; `make bench B=protocol` (or `python -m bench protocol`) runs one.
bench:
	$(PY) -m bench $(B)

## run: the main job: train the default example on a local cluster (progress bar; metrics, reward curve and
## summary in runs/<name>/). JOB=examples/<file>.yaml picks another job file.
JOB ?= examples/frozenlake.yaml
run:
	$(VENV)/bin/rollart run $(JOB)

## images: every service image from deploy/docker/Dockerfile (a local Debian base and redis image where the
## registry cannot be reached; Python packages through this host's pip settings). TAG=dev.
images:
	bash deploy/docker/build-images.sh

## compose-smoke: build the images, start the compose cluster (mTLS, host loopback), run a short FrozenLake
## job through the trainer's API, check health and bad input, remove everything (also a `slow` test).
compose-smoke:
	$(PY) deploy/smoke/compose_smoke.py

up:
	$(VENV)/bin/rollart up

down:
	$(VENV)/bin/rollart down

clean:
	rm -rf .rollart build *.egg-info
