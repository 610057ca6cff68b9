# HeteroFlow recipes. `just` lists them.

default:
    @just --list

# install and start the platform (embedded NATS + PostgreSQL unless URLs are set)
up:
    python3 -m venv .venv && . .venv/bin/activate && pip install -e . && heteroflow up

# install and run the whole test suite (what CI runs)
test:
    python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' && pytest

# unit tests only (no servers)
unit:
    .venv/bin/pytest tests/unit -q

# every test that starts no server (marks follow from fixtures; starting one is an error)
quick:
    HETEROFLOW_TEST_FORBID_SERVERS=1 .venv/bin/pytest -q -m "not integration and not slow"

# format, then the checks CI runs (ruff check, ruff format --check, mypy)
lint:
    .venv/bin/ruff format . && bash .ci/lint

# the checks CI runs, changing nothing
check:
    bash .ci/lint

# benchmarks (prints a table; see docs/benchmarks.md)
bench *SUITES:
    .venv/bin/python -m bench {{SUITES}}

# regenerate the committed JSON Schema of workload files (heteroflow apply -f)
files-schema:
    .venv/bin/python -m heteroflow.files.schema > docs/schema/heteroflow-files.json

# regenerate the committed OpenAPI document
openapi:
    .venv/bin/python -m services.api_gateway.openapi > docs/openapi.json

# regenerate the committed AsyncAPI document (FastStream, from every subscriber and publisher)
asyncapi:
    .venv/bin/python -m heteroflow.asyncapi > docs/asyncapi.json

# build the images without a registry: Debian base (cached), HeteroFlow, NATS (deploy/images)
images *WHAT:
    bash deploy/images/build.sh {{WHAT}}
