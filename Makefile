# The README's two commands: `make demo` and `make test`. Each installs what it runs first:
# the demos the core (scripts/setup.sh core: the verifier, its sandbox, the trainer on CPU),
# the tests and everything else all of it (`make setup`: DeepSpeed, vLLM, Node.js, Docker, ...).
VENV   := .venv
PY     := $(VENV)/bin/python
CORE   := $(VENV)/.setup-core
STAMP  := $(VENV)/.setup-done

.PHONY: setup test demo demo-data demo-band demo-entropy demo-verifier bench soak protos images engine-stop clean gpu-check

setup: $(STAMP)

# Re-run the installer when the dependency list or the installer itself changes.
$(CORE): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh core
	touch $(CORE)

$(STAMP): $(CORE) pyproject.toml scripts/setup.sh tests/node/package-lock.json
	bash scripts/setup.sh full
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

demo: $(CORE)
	$(PY) scripts/demo.py

# The toy world that the demo and trainer/configs/quickstart.yaml read, into runs/demo-data/ (as
# `make demo` writes it; left as it is when the generator's arguments have not changed).
demo-data: $(CORE)
	$(PY) -c "import sys; sys.path.insert(0, 'scripts'); import demo; demo.write_data(demo.ROOT / 'runs' / 'demo-data')"

# The demo's headline as a band: its recipe over seeds 0-2 on this CPU's kernels and on AVX2
# ones (6 demo runs, 2 at a time); writes docs/demo/band.json and the plots, prints the table.
demo-band: $(CORE)
	$(PY) scripts/demo_band.py --plots $(BAND_ARGS)

# The demo's recipe over 3 seeds with and without adaptive entropy control (about 6 demo runs).
demo-entropy: $(CORE)
	$(PY) scripts/demo_entropy.py --jobs 2

demo-verifier: $(CORE)
	$(PY) scripts/demo_verifier.py

bench: setup
	$(PY) benchmarks/bench_math.py
	$(PY) benchmarks/bench_code.py

soak: setup
	$(PY) benchmarks/soak.py

# docs/gpu.md. Here (no GPU): the CPU smoke test in the checkout's venv. On a CUDA machine:
# `make gpu-check WHEELS=DIR` skips `make setup` (no network there) and runs the machine's own
# python and torch (GPU_PY), installing what is missing from the wheels in DIR, offline.
GPU_PY ?= python3
gpu-check: $(if $(WHEELS),,setup)
	$(if $(WHEELS),$(GPU_PY),$(PY)) scripts/gpu_check.py $(if $(WHEELS),--wheels $(WHEELS)) $(GPU_CHECK_ARGS)

protos: setup
	bash scripts/gen_protos.sh

# magic-rlvr/verifier on the engine at DOCKER_HOST (or the default socket); as root with none
# answering, on a dockerd of our own, stopped afterwards (KEEP_ENGINE=1: left running; then
# `make engine-stop`). Offline: debootstrapped base image and a host-built wheelhouse.
images: setup
	$(PY) -m scripts.docker_engine images $(if $(KEEP_ENGINE),--keep-engine)

engine-stop: setup
	$(PY) -m scripts.docker_engine stop

clean:
	rm -rf $(VENV) runs .pytest_cache
