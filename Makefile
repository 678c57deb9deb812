# The README's commands.  Each target creates its own virtualenv on first use.
#   make demo   - set up and run the demo on the embedded store (no HBase, no Docker)
#   make test   - set up and run the whole test suite against a real local HBase (the
#                 long trials included; make test-quick leaves them out)
#   make lint   - ruff (rules and formatting) and mypy
#   make compose-check         - build the images and run docker-compose.yml for real with
#                                podman (tests/deploy/compose_run.py; docs/operations.md)
#   make testcontainers-check  - the test suite's optional HBase-in-a-container path, against
#                                podman's Docker-compatible API and the locally built image
PYTHON ?= python3
VENV ?= .venv
# `make test` runs every test, the long adversarial trials (marker "slow": crash matrices,
# kill -9 soaks) included; `make test-quick` leaves those out while developing.
PYTEST_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-quick test-slow lint imports promtool venv bench clean compose-check testcontainers-check

venv: $(STAMP)

# The example pipeline is a package of its own, installed on purpose: the demo, the tests
# and the benchmarks use its observers and its `percolator demo` command.
$(STAMP): pyproject.toml examples/docpipeline/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,demo]'
	$(BIN)/python -m pip install --quiet -e examples/docpipeline
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/percolator demo $(DEMO_ARGS)

# Resolves HBase's jars through Maven (cached in ~/.m2) before pytest starts, so a fresh
# machine shows the download as its own step; the test session then starts HBase itself
# and stops it at the end.  pytest's exit code 5 ("no tests collected") is a failure here.
test: imports promtool
	$(BIN)/percolator hbase classpath
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests - treating as failure" >&2; exit 1; fi; \
	exit $$rc

test-quick: $(STAMP)
	$(MAKE) test PYTEST_ARGS='-m "not slow"'

test-slow: $(STAMP)
	$(MAKE) test PYTEST_ARGS='-m slow'

# mypy cannot read pyproject's package-dir mapping: it checks the installed layout, staged
# by tools/layout.py (oracle/ becomes percolator/oracle/, and so on).  The example package
# is checked from its folder (pyproject's mypy_path finds it for bench's imports).
lint: imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy build/layout/percolator bench tools examples/docpipeline/docpipeline

# promtool checks the alert rules and the dashboard's queries (tests/test_observability.py).
promtool:
	@command -v promtool >/dev/null || { echo "installing promtool (Debian package prometheus)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  --no-install-recommends prometheus >/dev/null; }

# The layering and no-cycle contracts (pyproject's [tool.importlinter]) on the staged layout.
imports: $(STAMP)
	$(BIN)/python tools/layout.py build/layout
	cd build/layout && PYTHONPATH=. ../../$(BIN)/lint-imports --config ../../pyproject.toml

# Not part of `make test`: about 5 minutes with the base image and the images' dependency
# layers cached, about 14 on a fresh machine (docs/operations.md, "The deployment has run").
compose-check: $(STAMP)
	$(BIN)/python tests/deploy/compose_run.py $(COMPOSE_ARGS)

testcontainers-check: $(STAMP)
	sh tests/deploy/testcontainers_run.sh $(BIN)/python $(TESTCONTAINERS_TESTS)

bench: $(STAMP)
	$(BIN)/python bench/run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
