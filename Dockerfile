# The project's images, one target per role (docs/operations.md, "Images"):
#
#   engine   the `percolator` command without Java or PySpark: the timestamp oracle, gc,
#            status, and the base for your own observer images (docker/custom-observer/)
#   example  engine + the example pipeline (examples/docpipeline): the compose workers
#   spark    engine + Java + PySpark: `percolator backfill` and `percolator export`
#
#   docker build --target engine  -t percolator:latest .
#   docker build --target example -t percolator-example:latest .
#   docker build --target spark   -t percolator-spark:latest .
#
# BASE_IMAGE is any Debian 12 image: the public python:3.11-slim-bookworm by default, or a
# bare Debian made locally where no registry can be reached (docker/local/make-base-image.sh);
# Python is installed from Debian's packages when the base has none.
# Dependencies are installed from pyproject.toml alone, before any source is copied: a code
# change rebuilds only the small wheel layers, never PySpark.  Every image runs as the
# unprivileged user `percolator` (uid 10001).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- Python, a virtualenv, the unprivileged user -------------------------------------------
FROM ${BASE_IMAGE} AS python
RUN set -eux; \
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3 python3-venv; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/venv; \
    groupadd --system --gid 10001 percolator; \
    useradd --system --uid 10001 --gid percolator --create-home --home-dir /home/percolator \
        --shell /usr/sbin/nologin percolator
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# --- the engine's dependencies, from pyproject.toml only -----------------------------------
FROM python AS engine-deps
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY --chmod=755 docker/healthz /usr/local/bin/percolator-healthz

# --- wheels of the project and of the example package (the only stage that sees source) ----
FROM python AS wheels
COPY pyproject.toml README.md ./
COPY percolator ./percolator
COPY oracle ./oracle
COPY observers ./observers
COPY spark_jobs ./spark_jobs
COPY examples/docpipeline ./examples/docpipeline
RUN pip wheel --no-deps --wheel-dir /wheels . ./examples/docpipeline

# --- engine: oracle, gc, status, base of custom observer images ----------------------------
FROM engine-deps AS engine
COPY --from=wheels /wheels/percolator_engine-*.whl /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER percolator
WORKDIR /home/percolator
ENTRYPOINT ["percolator"]
CMD ["--help"]

# --- example: the engine with the example pipeline's observers (the compose workers) -------
FROM engine AS example
USER root
COPY --from=wheels /wheels/percolator_docpipeline-*.whl /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER percolator

# --- spark: Java and PySpark for backfill and export -----------------------------------------
FROM python AS spark
# Java runs Spark's driver and executors; procps gives Spark's scripts `ps`.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['spark']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY --chmod=755 docker/healthz /usr/local/bin/percolator-healthz
COPY --from=wheels /wheels/percolator_engine-*.whl /tmp/wheels/
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER percolator
WORKDIR /home/percolator
ENTRYPOINT ["percolator"]
CMD ["backfill", "--help"]
