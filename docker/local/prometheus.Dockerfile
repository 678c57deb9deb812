# Prometheus from Debian's packages, for machines that cannot pull prom/prometheus: the
# compose file's `prometheus` service runs it unchanged (same flags, same paths) with
#   PROMETHEUS_IMAGE=localhost/prometheus-debian:latest
# Build: podman build --network host -f docker/local/prometheus.Dockerfile \
#            -t localhost/prometheus-debian:latest docker/local
ARG BASE_IMAGE=localhost/bookworm-min:latest
FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
ENTRYPOINT ["/usr/bin/prometheus"]
