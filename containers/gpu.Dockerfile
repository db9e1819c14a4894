# pagemill's SDK worker image for GPU workers (Dataflow --sdk_container_image; Flink/Spark with a GPU pool).
# Build from the checkout, after writing the hashed lock files (containers/lock_requirements.sh) and with the
# bases' digests (docs/runners.md, "Worker images"):
#   docker build -f containers/gpu.Dockerfile --build-arg PYTHON_DIGEST=sha256:... \
#     --build-arg BEAM_SDK_DIGEST=sha256:... -t pagemill-gpu:0.1.0 .
# No weights are downloaded at run time: add the model as an image layer (containers/model.Dockerfile) or
# mount it as a volume at the path --model names. tests/test_containers.py checks every pin against pyproject.toml.
ARG BEAM_VERSION=2.77.0
ARG PYTHON_VERSION=3.11
# Bases by digest, never by tag alone: no default, so a build that is not given them fails.
ARG PYTHON_DIGEST
ARG BEAM_SDK_DIGEST

# Beam's boot entrypoint (it fetches the pipeline options, starts the SDK harness, and runs a worker pool with
# --worker_pool) comes from the SDK image of the same Beam version as the apache-beam pin.
FROM apache/beam_python${PYTHON_VERSION}_sdk:${BEAM_VERSION}@${BEAM_SDK_DIGEST} AS beam

FROM python:${PYTHON_VERSION}-slim-bookworm@${PYTHON_DIGEST}
ARG BEAM_VERSION
ARG VLLM_VERSION=0.32.0
# Tesseract for OCR hints; the NVIDIA driver comes from the host (Dataflow: install-nvidia-driver), the CUDA
# runtime from vLLM's wheels.
# g++: pdqhash and zss come as source archives only (hashed in the lock); it is purged after the install.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends tesseract-ocr g++ \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group pagemill
COPY --from=beam /opt/apache/beam /opt/apache/beam
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING
COPY pyproject.toml README.md /opt/pagemill/
COPY containers/requirements-gpu.lock /opt/pagemill/containers/
COPY pipelines /opt/pagemill/pipelines
COPY transforms /opt/pagemill/transforms
COPY schemas /opt/pagemill/schemas
# Every wheel by its hash (the lock holds pyproject's pins, the gpu extra's vllm==${VLLM_VERSION}, and all they
# need, CUDA torch from PyPI included); then pagemill itself, with no dependency resolved and nothing downloaded.
RUN pip install --no-cache-dir --require-hashes --no-deps -r /opt/pagemill/containers/requirements-gpu.lock \
    && pip install --no-cache-dir --no-deps --no-index --no-build-isolation /opt/pagemill \
    && python -c "import apache_beam, vllm, pipelines.cli; assert apache_beam.__version__ == '${BEAM_VERSION}'" \
    && apt-get purge -y -q --auto-remove g++
USER pagemill
ENTRYPOINT ["/opt/apache/beam/boot"]
