# Two commands on a fresh machine:
#   make demo   create .venv, install vitsweep, run a ViT patch-size multirun (2/4/8) on the embedded
#               digits data and print test accuracy and time per patch size
#   make test   create .venv, install vitsweep with its test extras (trackers and submitit included), run the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch 2.14.1 / torchvision 0.29.1 install from this workplace's disk; elsewhere pip picks any torch>=2.4.
TORCH  ?= torch==2.14.1 torchvision==0.29.1
DEMO_DIR ?= outputs/demo
PYTEST_ARGS ?= -m "not slow"

.PHONY: install demo test test-all bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	# compat editable mode puts the repo on sys.path, so Hydra's scan of the hydra_plugins namespace finds
	# the vitsweep sweeper and launcher (setuptools' default PEP 660 finder hides them: hydra issues 2359, 3252).
	$(PY) -m pip install -q -e '.[dev,dicom,dashboard,postgres,tensorboard,mlflow,submitit]' --config-settings editable_mode=compat
	touch $@

install: $(VENV)/.installed

demo: install
	rm -rf $(DEMO_DIR)
	$(PY) -m src.train -m model.patch=2,4,8 model.dim=64 model.depth=2 model.heads=4 model.mlp_dim=128 \
		model.dropout=0.1 optimizer.lr=2e-3 scheduler.warmup_epochs=1 trainer.max_epochs=10 trainer.batch_size=64 \
		trainer.progress=false hydra.sweep.dir=$(DEMO_DIR)
	$(PY) -m analysis.report $(DEMO_DIR) --out $(DEMO_DIR)/report
	@cat $(DEMO_DIR)/report/tables/results.md

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

test-all: install
	$(PY) -m pytest

bench: install
	$(PY) benchmarks/throughput.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
