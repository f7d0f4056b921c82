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
# the slowest 20 tests are printed at the end: the default suite must stay under 15 minutes (CI). It runs in
# TEST_WORKERS processes (pytest-xdist), a test file's tests in one process (module fixtures built once); most tests
# wait on subprocesses, so 2 workers share 2 cores well (tests/conftest.py: 1 torch thread each; `make test
# TEST_WORKERS=0` runs them in this process)
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=20

.PHONY: install demo test test-all bench reports clean

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

# reports: a double descent's two readings: the declared test (centre: the critical width) and the post hoc one centred on
# the interpolation threshold, as `--center`:<file under analysis/>
CENTRES := critical:declared_test threshold:sensitivity_threshold
# every study analysis that regenerates from its committed records (docs/studies/README.md; tests/test_design.py and
# tests/test_study_scripts.py check that the tables come back byte for byte)
S := docs/studies
reports: install
	$(PY) -m analysis.report $(S)/heads_depth/records/main --out $(S)/heads_depth/analysis
	$(PY) $(S)/heads_depth/scripts/orderings.py $(S)/heads_depth/records/main $(S)/heads_depth/analysis/orderings \
		> $(S)/heads_depth/analysis/orderings/orderings.md
	$(PY) $(S)/heads_depth/scripts/orderings.py $(S)/heads_depth/records/main $(S)/heads_depth/analysis --declared \
		> /dev/null
	$(PY) $(S)/heads_depth/scripts/orderings.py $(S)/heads_depth/records/confirm $(S)/heads_depth/analysis/confirm \
		--declared > /dev/null
	$(PY) -m analysis.report $(S)/double_descent_cnn/records/main $(S)/double_descent_cnn/records/main_seed6 \
		$(S)/double_descent_cnn/records/main_seeds789 \
		--out $(S)/double_descent_cnn/analysis
	$(PY) -m analysis.design plan $(S)/double_descent_cnn/records/pilot_gpu --out $(S)/double_descent_cnn/analysis/pilot_plan.md
	$(PY) -m analysis.design test $(S)/double_descent_cnn/records/main $(S)/double_descent_cnn/records/main_seed6 \
		$(S)/double_descent_cnn/records/main_seeds789 \
		--pilot $(S)/double_descent_cnn/records/pilot_gpu --out $(S)/double_descent_cnn/analysis/main_test.md
	$(PY) -m analysis.design test $(S)/double_descent_cnn/records/main_fixed $(S)/double_descent_cnn/records/main_fixed_seeds789 \
		--capped-from $(S)/double_descent_cnn/records/main $(S)/double_descent_cnn/records/main_seed6 \
		$(S)/double_descent_cnn/records/main_seeds789 --curves \
		--pilot $(S)/double_descent_cnn/records/pilot_gpu --out $(S)/double_descent_cnn/analysis/main_fixed_test.md
	$(PY) -m analysis.design plan $(S)/double_descent_vit/records/pilot_gpu --effect 0.03 \
		--out $(S)/double_descent_vit/analysis/pilot_plan.md
	for grid in main_gpu main_bf16; do \
		$(PY) -m analysis.report $(S)/double_descent_vit/records/$$grid --out $(S)/double_descent_vit/analysis/$$grid; \
		for c in $(CENTRES); do \
			$(PY) -m analysis.design test $(S)/double_descent_vit/records/$$grid --center $${c%%:*} \
				--pilot $(S)/double_descent_vit/records/pilot_gpu \
				--effect 0.03 --out $(S)/double_descent_vit/analysis/$$grid/$${c#*:}.md > /dev/null; \
		done; \
	done
	for c in $(CENTRES); do \
		$(PY) -m analysis.design test $(S)/double_descent_vit/records/fixed_bf16 --capped-from \
			$(S)/double_descent_vit/records/main_bf16 --curves --center $${c%%:*} \
			--pilot $(S)/double_descent_vit/records/pilot_gpu --effect 0.03 \
			--out $(S)/double_descent_vit/analysis/fixed_bf16/$${c#*:}.md > /dev/null; \
	done
	$(PY) -m analysis.design compare $(S)/double_descent_vit/records/main_bf16 --against \
		$(S)/double_descent_vit/records/main_gpu --out $(S)/double_descent_vit/analysis/devices.md > /dev/null
	$(PY) -m analysis.report $(S)/double_descent_cnn_cifar10/records/earlier_cpu \
		$(S)/double_descent_cnn_cifar10/records/earlier_cpu_threshold --out $(S)/double_descent_cnn_cifar10/analysis/earlier_cpu
	$(PY) -m analysis.design plan $(S)/double_descent_cnn_cifar10/records/pilot_gpu \
		$(S)/double_descent_cnn_cifar10/records/pilot_gpu_threshold --out $(S)/double_descent_cnn_cifar10/analysis/pilot_plan.md
	for arm in main main_fixed; do \
		$(PY) -m analysis.report $(S)/double_descent_cnn_cifar10/records/$$arm --out $(S)/double_descent_cnn_cifar10/analysis/$$arm; \
		for c in $(CENTRES); do \
			$(PY) -m analysis.design test $(S)/double_descent_cnn_cifar10/records/$$arm --center $${c%%:*} \
				--pilot $(S)/double_descent_cnn_cifar10/records/pilot_gpu $(S)/double_descent_cnn_cifar10/records/pilot_gpu_threshold \
				--out $(S)/double_descent_cnn_cifar10/analysis/$$arm/$${c#*:}.md > /dev/null; \
		done; \
	done
	$(PY) $(S)/heads_depth/scripts/precision_check.py $(S)/heads_depth/records/precision \
		$(S)/heads_depth/analysis/precision_check.md --main $(S)/heads_depth/records/main > /dev/null
	$(PY) $(S)/attention/scripts/declared_test.py $(S)/attention/analysis/seeds/attention_stats.csv \
		$(S)/attention/analysis/seeds/declared_test.md > /dev/null
	for s in patch_size:rerun vit_vs_cnn:rerun tune_vit:rerun_median tune_vit:rerun_none; do \
		$(PY) -m analysis.report $(S)/$${s%%:*}/records/$${s#*:} --out $(S)/$${s%%:*}/analysis/$${s#*:}; \
	done
	git status --short $(S)

clean:
	rm -rf $(VENV) outputs .pytest_cache
