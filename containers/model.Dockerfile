# A model's weights as a layer on a pagemill worker image, so that nothing is downloaded at run time:
# the build context is the model folder itself.
#   docker build -f containers/model.Dockerfile --build-arg BASE=pagemill-gpu:0.1.0 \
#     --build-arg MODEL_NAME=Qwen2.5-VL-7B-Instruct -t pagemill-gpu-qwen:0.1.0 /path/to/Qwen2.5-VL-7B-Instruct
# then run with --model /models/Qwen2.5-VL-7B-Instruct (the same path on every worker).
ARG BASE=pagemill-gpu:0.1.0
FROM ${BASE}
ARG MODEL_NAME
COPY . /models/${MODEL_NAME}
