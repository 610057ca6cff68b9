# The HeteroFlow image: every service, the agent and the CLIs (one console script) on the
# Debian base of build-base.sh, installed from wheels built on the host, no index reached.
ARG BASE=heteroflow/base:bookworm
FROM ${BASE}
ENV HOME=/var/lib/heteroflow HETEROFLOW_HOME=/var/lib/heteroflow PATH=/opt/heteroflow/bin:$PATH
# Dependencies first: their layer is reused while only the project's wheel changes.
COPY deps /tmp/deps
RUN python3 -m venv /opt/heteroflow \
    && /opt/heteroflow/bin/pip install --no-cache-dir --no-index --find-links /tmp/deps /tmp/deps/*.whl \
    && rm -rf /tmp/deps
COPY app /tmp/app
RUN /opt/heteroflow/bin/pip install --no-cache-dir --no-index --no-deps /tmp/app/*.whl \
    && rm -rf /tmp/app \
    && mkdir -p /var/lib/heteroflow && chown 10001:10001 /var/lib/heteroflow \
    && echo 'heteroflow:x:10001:10001::/var/lib/heteroflow:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'heteroflow:x:10001:' >> /etc/group
# Not root by default; an agent that drives the host's Docker socket runs as root instead.
# A passwd entry: PostgreSQL's initdb (the compose deployment's database) looks the user up.
USER 10001
WORKDIR /var/lib/heteroflow
EXPOSE 3333 9000
ENTRYPOINT ["/usr/bin/tini", "--", "heteroflow"]
CMD ["--help"]
