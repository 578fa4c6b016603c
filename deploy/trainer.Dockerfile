# The trainer: `trainer run` on a vLLM release image (CUDA, PyTorch and vLLM already there).
# Build from the repository root:
#
#   docker build -f deploy/trainer.Dockerfile -t magic-rlvr/trainer .
#   docker build -f deploy/trainer.Dockerfile --build-arg VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z ...
#
# It talks to the verifier fleet only through `--verifier-addr dns:///verifier:50051` and sends
# the bearer token from $VERIFIER_TOKEN (the client library's default variable).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DS_BUILD_OPS=0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY verifier ./verifier
COPY sandbox ./sandbox
COPY trainer ./trainer
COPY datasets ./datasets
COPY protos ./protos
# Keep the image's torch and vLLM (they match its CUDA): install the project and the training
# extras on top without letting pip swap them.
RUN python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
 && pip install --upgrade-strategy only-if-needed ".[train,deepspeed]" \
 && python3 -c "import torch, vllm, trainer.magic.rules, verifier.client; print('ok')"

RUN useradd --create-home --uid 10002 --user-group trainer && mkdir -p /app/runs \
 && chown trainer:trainer /app/runs
USER 10002:10002
VOLUME ["/app/runs"]

# The vLLM image's entrypoint is its OpenAI server: replace it with the trainer.
ENTRYPOINT ["python3", "-m", "trainer.cli"]
CMD ["run", "--config", "trainer/configs/demo.yaml", "--verifier-addr", "dns:///verifier:50051"]
