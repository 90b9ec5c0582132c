# syntax=docker/dockerfile:1
# One image for every gpupool process: the gateway (`serve`), the scheduler extender (`extender`), the
# node agent (`agent`) and the kubelet device plugin (`device-plugin`); the chart picks the command.
# Build: `make image` (docker build -t gpupool/gpupool:0.1.0 .). Needs BuildKit (bind mount below).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: the gpupool wheel and the wheels of its runtime extras, nothing else
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --wheel-dir /wheels ".[gateway,nvml,k8s]"

# ---- runtime: slim Python, the wheels installed offline, a non-root user
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "gpupool[gateway,nvml,k8s]" \
    && groupadd --system --gid 10001 gpupool \
    && useradd --system --uid 10001 --gid gpupool --home-dir /var/lib/gpupool --create-home gpupool
COPY examples /usr/share/gpupool/examples
USER 10001:10001
WORKDIR /var/lib/gpupool
# 8080 gateway, 8888 extender, 9400 agent /metrics
EXPOSE 8080 8888 9400
ENTRYPOINT ["gpupool"]
# The default command: the gateway on the example cluster (the chart passes its own --cluster/--workloads).
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--data-dir", "/var/lib/gpupool", \
     "--cluster", "/usr/share/gpupool/examples/cluster-a100-l40s.yaml", \
     "--workloads", "/usr/share/gpupool/examples/workloads-agent-platform.yaml"]
