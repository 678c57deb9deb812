# The project image: the `percolator` command with Spark (for backfill/export) and the
# example observers (the package examples/docpipeline, installed on purpose).  Used by the oracle, worker, backfill and gc services of
# docker-compose.yml.  Build: docker build -t percolator .
FROM python:3.11-slim-bookworm

# Java runs Spark's driver and executors for `percolator backfill` / `export`.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY percolator ./percolator
COPY oracle ./oracle
COPY observers ./observers
COPY spark_jobs ./spark_jobs
COPY proto ./proto
COPY examples/docpipeline ./examples/docpipeline
RUN pip install --no-cache-dir '.[spark]' ./examples/docpipeline

# Your own observers: build FROM this image and `pip install` your package.
ENTRYPOINT ["percolator"]
CMD ["--help"]
