#!/usr/bin/env bash
# Writes the hashed lock files that the worker images install from (pip --require-hashes), resolved on the
# images' own base so that the wheels chosen are the ones the image can use. Needs Docker and the network, so it
# runs on a build machine, not at image build time; commit what it writes beside the recipes.
#
#   PYTHON_DIGEST=sha256:... containers/lock_requirements.sh
#
#   containers/requirements-gpu.lock   pyproject's dependencies with the gpu extra (CUDA torch from PyPI)
#   containers/requirements-cpu.lock   the same with the cpu extra, less torch
#   containers/torch-cpu.lock          torch alone, from PyTorch's CPU index (installed with --index-url: the
#                                      only index it may come from)
# setuptools (pagemill's build backend) is locked too: pagemill itself is installed with --no-build-isolation.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PYTHON_DIGEST:?the digest of the images base, as given to docker build (docs/runners.md, Worker images)}"
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
PIP_TOOLS_VERSION=${PIP_TOOLS_VERSION:-7.6.2}
docker run --rm -v "$PWD:/src" -w /src -e TORCH_CPU_INDEX="$TORCH_CPU_INDEX" \
  "python:3.11-slim-bookworm@${PYTHON_DIGEST}" sh -euc "
  pip install -q 'pip-tools==$PIP_TOOLS_VERSION'
  echo 'setuptools>=68' > /tmp/build.in
  compile() { pip-compile -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url \"\$@\" pyproject.toml /tmp/build.in; }
  compile --extra gpu -o containers/requirements-gpu.lock
  compile --extra cpu --extra-index-url \"\$TORCH_CPU_INDEX\" -o /tmp/cpu.lock
  python - <<'PY'
import re
entries = re.split(r'\n(?=\S)', open('/tmp/cpu.lock').read())  # one requirement with its hashes and comments
torch = [e for e in entries if re.match(r'torch==', e)]
assert len(torch) == 1, 'expected torch in the cpu lock'
open('containers/torch-cpu.lock', 'w').write(torch[0].rstrip() + '\n')
open('containers/requirements-cpu.lock', 'w').write('\n'.join(e for e in entries if e not in torch).rstrip() + '\n')
PY
"
echo "wrote containers/requirements-gpu.lock, containers/requirements-cpu.lock, containers/torch-cpu.lock"
