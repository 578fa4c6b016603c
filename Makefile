# The README's two commands: `make demo` and `make test`. Both run `make setup` first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done

.PHONY: setup test demo demo-verifier bench protos clean

setup: $(STAMP)

# Re-run the installer when the dependency list or the installer itself changes.
$(STAMP): pyproject.toml scripts/setup.sh tests/node/package-lock.json
	bash scripts/setup.sh
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

demo: setup
	$(PY) scripts/demo.py

demo-verifier: setup
	$(PY) scripts/demo_verifier.py

bench: setup
	$(PY) benchmarks/bench_math.py
	$(PY) benchmarks/bench_code.py

protos: setup
	bash scripts/gen_protos.sh

clean:
	rm -rf $(VENV) runs .pytest_cache
