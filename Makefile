# pagemill: `make demo` sets up and runs the demo job; `make test` runs ruff and the test suite.
DEVICE ?= cpu
VENV := .venv
PY := $(VENV)/bin/python
TEST_MODEL := .cache/test-model

.PHONY: setup demo test lint bench mutate clean

$(VENV)/.installed: pyproject.toml scripts/setup_venv.sh
	scripts/setup_venv.sh $(DEVICE)
	touch $@

setup: $(VENV)/.installed

$(TEST_MODEL)/config.json: $(VENV)/.installed $(wildcard pipelines/tiny_models/*.py)
	$(VENV)/bin/pagemill make-test-model $(TEST_MODEL)

demo: setup $(TEST_MODEL)/config.json
	$(VENV)/bin/pagemill run --job jobs/demo.yaml
	$(VENV)/bin/pagemill sql --output out/demo \
	  "SELECT d.source_uri, d.outcome, d.reason_code, count(p.page_index) AS pages, \
	          count(*) FILTER (WHERE p.status = 'ok') AS ok_pages \
	   FROM documents d LEFT JOIN pages p USING (run_id, doc_sha256, source_uri) \
	   GROUP BY ALL ORDER BY 1"

lint: setup
	$(VENV)/bin/ruff check .

# Two pytest-xdist workers, a file's tests on one (tests/conftest.py says what is shared across them).
test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q --timeout=600 -n 2 --dist loadfile --no-loadscope-reorder

bench: setup $(TEST_MODEL)/config.json
	$(PY) benchmarks/bench_render.py
	$(PY) benchmarks/bench_extract.py --model $(TEST_MODEL)

# Mutation testing of the stage modules that changed most with their fast unit tests ([tool.mutmut] in
# pyproject.toml; a score per module). Not part of CI, CPU heavy. Installs the `mutate` extra (mutmut) on first use.
mutate: setup
	$(PY) -c "import mutmut" 2>/dev/null || $(VENV)/bin/pip install -q -e ".[mutate]"
	$(PY) scripts/mutate.py

clean:
	rm -rf out .cache mutants
