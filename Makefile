# Two commands do all the set-up on a fresh machine:
#   make demo   installs, then collects from CartPole on an embedded LocalCluster
#   make test   installs, then runs ruff, builds the docs (strict) and runs the test suite
# For iterating, make test-fast leaves out the docs' scripts and the tests marked slow.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: bench-gpu install demo test test-fast lint docs compat bench bench-smoke clean
# Two pytest-xdist workers: the suite waits on clusters, scripts and sub-processes as much as it computes.
# A file's tests run in one worker, in order: a page's `skip` comment then applies to its next block, and
# the simulated hosts of tests/test_netns.py (one bridge) are built one rig at a time.
PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder
RAY_STAMP := $(VENV)/.installed-ray

$(STAMP): pyproject.toml requirements/dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	touch $(STAMP)

install: $(STAMP)

# Ray only for the benchmarks that run TorchRL's RayCollector (P5): see pyproject.toml's "ray" extra.
$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install -q -e .[ray]
	touch $(RAY_STAMP)

demo: install
	$(VENV)/bin/daskcollect run --env CartPole-v1 --collectors 2 --frames 20000

lint: install
	$(VENV)/bin/ruff check daskcollect tests benchmarks examples tools conftest.py
	$(VENV)/bin/ruff format --check daskcollect tests benchmarks examples tools conftest.py

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site

# The docs build runs beside the tests (it takes seconds; its failure fails the target all the same).
test: lint
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site & docs=$$!; \
	$(PY) -m pytest $(PARALLEL); tests=$$?; wait $$docs || exit 1; exit $$tests

test-fast: lint
	$(PY) -m pytest tests -m "not slow" $(PARALLEL)

# The newest releases of dask, distributed, torchrl and tensordict, past pyproject.toml's upper bounds, in a
# scratch venv, and the fast suite against them (docs/deployment.md#versions). pip warns about the bounds
# it was told to step over; what it installed is printed before the tests.
COMPAT ?= /tmp/daskcollect-compat
compat:
	rm -rf $(COMPAT)
	python3 -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install -q --upgrade pip
	$(COMPAT)/bin/python -m pip install -q -r requirements/dev.txt
	-$(COMPAT)/bin/python -m pip install -q --upgrade dask distributed torchrl tensordict
	for p in dask distributed torchrl tensordict; do $(COMPAT)/bin/python -m pip index versions $$p 2>/dev/null | head -1; done
	$(COMPAT)/bin/python -m pip list 2>/dev/null | grep -iE "^(dask|distributed|torch|torchrl|tensordict) "
	$(COMPAT)/bin/python -m pytest tests -m "not slow" -p no:cacheprovider

# The benchmarks (docs/benchmarks.md): about 20 min on 2 cores (measured 2026-12-02), plus about 25 for P7 (2026-12-03)
# and about 40 for the envelope, P8, P10 and the cross-host runs (2026-12-04); do not run anything else meanwhile.
bench: $(RAY_STAMP)
	$(PY) benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 7
	$(PY) benchmarks/throughput.py --env Pendulum-v1 --workers 2 --pairs 7
	$(PY) benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 3 --against ray
	$(PY) benchmarks/scaling.py --workers 4 8 16 --pairs 3
	$(PY) benchmarks/broadcast.py --sizes-mb 1 10 100 --workers 2 4 8
	$(PY) benchmarks/datapath.py --repeats 10
	$(PY) benchmarks/startup.py --workers 4 --pairs 3
	$(PY) benchmarks/lag.py --batches 300
	$(PY) benchmarks/replay_buffer.py --frames 4000 --pairs 3
	$(PY) benchmarks/reattach.py --build-seconds 3 --pairs 3
	$(PY) benchmarks/central_inference.py --sizes 256 1024 2048 4096 --pairs 3 --total-frames 4000 --png docs/img/central_inference.png
	$(PY) benchmarks/cold_start.py --repeats 3
	$(PY) benchmarks/driver_cost.py --collectors 8 16 32 --pairs 3
	$(PY) benchmarks/driver_cost.py --collectors 16 --pairs 3 --external
	$(PY) benchmarks/driver_cost.py --collectors 8 16 --pairs 4 --with-dask-streams --out benchmarks/results/driver_cost-8-16.json
	$(PY) benchmarks/driver_cost.py --env pixels --step 0.001 --collectors 4 8 --pairs 3 --with-dask-streams
	$(PY) benchmarks/envelope.py --collectors 2 8 16 --hosts 4 --pairs 2 --seconds 8
	$(PY) benchmarks/throughput.py --num-envs 8 --frames-per-batch 800 --total-frames 16800 --pairs 3
	$(PY) benchmarks/probes_overhead.py --pairs 7
	$(PY) benchmarks/cross_host.py --pairs 3
	$(PY) benchmarks/cross_host.py --parts weights --rate 100mbit --sizes-mb 10 --out benchmarks/results/cross_host_100mbit.json
	$(PY) benchmarks/cross_host.py --parts pixels --hosts 1 --workers-per-host 4 --pairs 3 --out benchmarks/results/cross_host_pixels.json
	$(PY) benchmarks/scheduler_cost.py --workers 4 32 --seconds 20
	tools/slurm.sh start && $(PY) benchmarks/slurm_demand.py --png docs/img/slurm_demand.png
	$(PY) benchmarks/report.py

# Every benchmark with tiny budgets, into a scratch folder: they keep working (CI runs this).
SMOKE := $(shell mktemp -d -u /tmp/daskcollect-bench-XXXXXX)
# The GPU check of central inference, on a machine with a GPU: the servers run the policy on it.
bench-gpu: $(RAY_STAMP)
	$(PY) benchmarks/central_inference.py --sizes 1024 4096 --pairs 2 --total-frames 4000 --device cuda --out benchmarks/results/central_inference_gpu.json

bench-smoke: $(RAY_STAMP)
	mkdir -p $(SMOKE)
	$(PY) benchmarks/throughput.py --total-frames 2000 --frames-per-batch 500 --pairs 1 --out $(SMOKE)/p1.json
	$(PY) benchmarks/throughput.py --total-frames 2000 --frames-per-batch 500 --pairs 1 --against ray --out $(SMOKE)/p5.json
	$(PY) benchmarks/scaling.py --workers 2 --seconds 1 --frames-per-batch 10 --pairs 1 --out $(SMOKE)/p2.json
	$(PY) benchmarks/broadcast.py --sizes-mb 0.1 --workers 2 --repeats 2 --warmup 1 --out $(SMOKE)/p3.json
	$(PY) benchmarks/datapath.py --repeats 1 --out $(SMOKE)/p4.json
	$(PY) benchmarks/startup.py --workers 2 --pairs 1 --frames-per-batch 100 --out $(SMOKE)/p6.json
	$(PY) benchmarks/lag.py --batches 20 --frames-per-batch 50 --out $(SMOKE)/lag.json
	$(PY) benchmarks/replay_buffer.py --frames 400 --frames-per-batch 100 --pairs 1 --out $(SMOKE)/rb.json
	$(PY) benchmarks/cold_start.py --repeats 1 --frames 2000 --out $(SMOKE)/cold.json
	$(PY) benchmarks/driver_cost.py --collectors 2 --seconds 1 --pairs 1 --out $(SMOKE)/p7.json
	$(PY) benchmarks/envelope.py --collectors 2 --seconds 1 --pairs 1 --out $(SMOKE)/envelope.json
	$(PY) benchmarks/throughput.py --num-envs 2 --frames-per-batch 100 --total-frames 400 --pairs 1 --out $(SMOKE)/p8.json
	$(PY) benchmarks/probes_overhead.py --pairs 1 --batches 3 --out $(SMOKE)/p10.json
	$(PY) benchmarks/cross_host.py --hosts 2 --workers-per-host 1 --pairs 1 --seconds 1 --sizes-mb 1 --repeats 1 --warmup 0 --out $(SMOKE)/cross_host.json
	$(PY) benchmarks/reattach.py --build-seconds 0.5 --pairs 1 --out $(SMOKE)/reattach.json
	$(PY) benchmarks/central_inference.py --sizes 64 --collectors 2 --pairs 1 --total-frames 800 --out $(SMOKE)/central.json --png $(SMOKE)/central.png
	$(PY) benchmarks/scheduler_cost.py --workers 2 --seconds 1 --out $(SMOKE)/scheduler_cost.json
	if [ "$$(id -u)" = 0 ] && command -v sbatch >/dev/null; then \
	  tools/slurm.sh start && $(PY) benchmarks/slurm_demand.py --phase 10 --max-jobs 3 --out $(SMOKE)/slurm_demand.json --png $(SMOKE)/slurm_demand.png; \
	  rc=$$?; tools/slurm.sh stop; exit $$rc; \
	else echo "bench-smoke: no SLURM here (tools/slurm.sh needs root and slurmctld): slurm_demand.py left out"; fi
	cp docs/benchmarks.md $(SMOKE)/benchmarks.md
	$(PY) benchmarks/report.py --doc $(SMOKE)/benchmarks.md --png $(SMOKE)/benchmarks.png --scale-png $(SMOKE)/scale.png --cross-host-png $(SMOKE)/cross_host.png
	rm -rf $(SMOKE)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info site
