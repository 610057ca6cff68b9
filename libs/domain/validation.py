"""Input checks at the edge: OCI image references, container paths, JSON shape, field limits.

Everything a client sends passes through here before it can become an event. The limits keep
one request from becoming a poison pill behind the gateway: an accepted task specification
always fits in one bus message (`SPEC_MAX_BYTES` is far below the NATS payload limit), and no
string reaches PostgreSQL that `jsonb` would refuse (NUL, lone surrogates).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from libs.domain.errors import Code, DomainError

if TYPE_CHECKING:
    from libs.domain.task.model import TaskSpec

# Per-field limits (characters unless said otherwise); named in every refusal.
IMAGE_MAX = 512
IMAGE_NAME_MAX = 255  # the repository name without tag or digest (distribution/reference)
COMMAND_MAX = 16_384
ENV_MAX_ENTRIES = 256
ENV_KEY_MAX = 256
ENV_VALUE_MAX = 8_192
ENV_TOTAL_MAX = 65_536  # all keys and values together
LABELS_MAX_ENTRIES = 64
LABEL_KEY_MAX = 128
LABEL_VALUE_MAX = 512
VOLUMES_MAX = 32
PATH_MAX = 1_024
ANTI_AFFINITY_MAX = 32
# Counts, sizes and durations a task names (seconds, minutes, MB) that have no natural
# bound: kept within a 32-bit integer, which every consumer of the event can hold.
INT_FIELD_MAX = 2**31 - 1
UNBOUNDED_INTS = ("gpu_memory_mb", "timeout", "idle_timeout_minutes", "oom_memory_limit")
SHORT_TEXT_MAX = 253  # gpu_type, requested_node_id, one anti-affinity key
REPORT_TEXT_MAX = 65_536  # `result` and `error` of an agent's or operator's status report
# The whole specification as the relay encodes it (JSON, ASCII-escaped): a backstop for
# non-ASCII text, whose escaped form can be up to 6 times its UTF-8 size.
SPEC_MAX_BYTES = 256 * 1024
# The most characters `json.dumps` writes for one byte of compact UTF-8 JSON (`check_task_spec`).
ESCAPED_PER_BYTE = 6
JSON_MAX_DEPTH = 32

# Mount points a task may never cover: the root, and the kernel's own file systems.
FORBIDDEN_MOUNTS = ("/proc", "/sys", "/dev")

# The reference grammar of distribution/reference (regexp.go), which Docker and OCI share:
#   reference := name [ ":" tag ] [ "@" digest ];  name := [domain "/"] path-component ("/" …)*
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII
)


def exactly_bool(value: Any) -> Any:
    """A before-validator: JSON true/false only. Bodies are validated laxly (lists become
    tuples), and lax validation would take "yes" or 1 where the document says boolean."""
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


def is_integer(value: Any) -> bool:
    """A JSON integer: `3`, or `3.0` (JSON Schema reads a number without a fraction as an
    integer, and some clients cannot tell them apart); never `true` or `"3"`."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def exactly_int(value: Any) -> Any:
    """A before-validator: a JSON integer (or null) only; lax validation would take "3"."""
    if value is None:
        return value
    if not is_integer(value):
        raise ValueError("must be an integer")
    return int(value)


def image_reference_error(ref: str) -> str | None:
    """Why `ref` is not a valid image reference, or None when it is."""
    if len(ref) > IMAGE_MAX:
        return f"is longer than {IMAGE_MAX} characters"
    match = IMAGE_REFERENCE.fullmatch(ref)
    if match is None:
        return (
            f"{ref!r} is not an image reference ([registry[:port]/]name[:tag][@digest]; "
            "lowercase name components, no spaces or shell characters)"
        )
    if len(match["name"]) > IMAGE_NAME_MAX:
        return f"repository name is longer than {IMAGE_NAME_MAX} characters"
    return None


def normalise_container_path(path: str) -> str:
    """The absolute, normalised form of a mount point, or ValueError naming the rule broken."""
    if "\x00" in path:
        raise ValueError("container_path must not contain NUL")
    if len(path) > PATH_MAX:
        raise ValueError(f"container_path is longer than {PATH_MAX} characters")
    if not path.startswith("/"):
        raise ValueError("container_path must be absolute")
    if ".." in path.split("/"):
        raise ValueError("container_path must not contain '..'")
    # normpath keeps a leading '//' (POSIX leaves it implementation-defined): collapse it first.
    norm = posixpath.normpath("/" + path.lstrip("/"))
    if norm == "/":
        raise ValueError("container_path must not be / (the container's root)")
    for forbidden in FORBIDDEN_MOUNTS:
        if norm == forbidden or norm.startswith(forbidden + "/"):
            raise ValueError(f"container_path must not be {forbidden} or below it")
    return norm


def check_json_document(value: Any, max_depth: int = JSON_MAX_DEPTH) -> None:
    """Refuse a parsed JSON document nested deeper than `max_depth` or holding a string that
    PostgreSQL's jsonb cannot store (NUL, unpaired surrogates). Iterative: no recursion limit
    to hit on hostile input. The error names the field path (`env.KEY`, `volumes.0.host_path`)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, path or "body")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            raise DomainError(
                Code.INVALID_VALUE,
                f"JSON nesting is deeper than {max_depth} levels at {path or 'body'}",
                [path.split(".")[0] if path else "body"],
            )
        children = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in children:
            child_path = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                _check_text(key, child_path)
            stack.append((child, child_path, depth + 1))


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise DomainError(Code.INVALID_VALUE, f"{path} contains a NUL character", [path])
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise DomainError(
            Code.INVALID_VALUE, f"{path} contains an unpaired Unicode surrogate", [path]
        ) from None


def check_spec_size(spec: Mapping[str, Any]) -> None:
    """Refuse a specification whose encoded form (as events carry it) passes SPEC_MAX_BYTES,
    naming the largest fields."""
    sizes = {k: len(json.dumps(v)) for k, v in spec.items()}
    total = sum(sizes.values()) + sum(len(k) + 4 for k in sizes)
    if total <= SPEC_MAX_BYTES:
        return
    largest = sorted(sizes, key=lambda k: -sizes[k])[:3]
    raise DomainError(
        Code.INVALID_VALUE,
        f"the task specification is {total} bytes encoded, more than {SPEC_MAX_BYTES}; "
        f"largest fields: {', '.join(f'{k} ({sizes[k]} bytes)' for k in largest)}",
        largest,
    )


def check_task_spec(spec: TaskSpec) -> TaskSpec:
    """The per-field limits of a create or update, each refusal naming its field; returns the
    spec with its mount points normalised. Applied at entry only (`parse_create`), never when
    stored events are loaded, so tightening a limit cannot make history unreadable."""
    # No image: the task runs as a plain process on a `process` node (docs/api.md).
    if spec.image and (why := image_reference_error(spec.image)) is not None:
        _refuse("image", f"image {why}")
    for field in UNBOUNDED_INTS:
        if (getattr(spec, field) or 0) > INT_FIELD_MAX:
            _refuse(field, f"{field} is larger than {INT_FIELD_MAX}")
    if len(spec.command) > COMMAND_MAX:
        _refuse("command", f"command is longer than {COMMAND_MAX} characters")
    for field in ("gpu_type", "requested_node_id"):
        if len(getattr(spec, field)) > SHORT_TEXT_MAX:
            _refuse(field, f"{field} is longer than {SHORT_TEXT_MAX} characters")
    _check_map("env", spec.env, ENV_MAX_ENTRIES, ENV_KEY_MAX, ENV_VALUE_MAX)
    if sum(len(k) + len(v) for k, v in spec.env.items()) > ENV_TOTAL_MAX:
        _refuse("env", f"env holds more than {ENV_TOTAL_MAX} characters in all")
    _check_map("labels", spec.labels, LABELS_MAX_ENTRIES, LABEL_KEY_MAX, LABEL_VALUE_MAX)
    check_label_keys(spec.labels)
    if len(spec.anti_affinity) > ANTI_AFFINITY_MAX:
        _refuse("anti_affinity", f"anti_affinity has more than {ANTI_AFFINITY_MAX} keys")
    for i, key in enumerate(spec.anti_affinity):
        if len(key) > SHORT_TEXT_MAX:
            _refuse(f"anti_affinity.{i}", f"anti_affinity key is longer than {SHORT_TEXT_MAX}")
        if key.lower().startswith(RESERVED_LABEL_PREFIX):
            # The scheduler spreads a training group's members by `heteroflow.training-group:`.
            raise DomainError(
                Code.SERVER_OWNED_FIELD,
                f"anti_affinity key {key!r} uses the reserved prefix {RESERVED_LABEL_PREFIX}",
                [f"anti_affinity.{i}"],
            )
    check_variants(spec)
    spec = _checked_volumes(spec)
    # json.dumps (ASCII-escaped, with ", " and ": ") writes a value in at most six times its
    # compact UTF-8 bytes (DEL: 1 byte, `\u007f`), so a compact form under a sixth of the
    # limit cannot pass it: the exact per-field sizes (a dump and an encoding per field) are
    # computed only near it. Bytes, not `model_dump_json`'s characters.
    if ESCAPED_PER_BYTE * len(spec.__pydantic_serializer__.to_json(spec)) > SPEC_MAX_BYTES:
        check_spec_size(spec.model_dump(mode="json"))
    return spec


# The top-level fields a task with variants leaves to its variants (each names its cards).
VARIANT_CARD_FIELDS = ("gpu_required", "gpu_type", "gpu_memory_mb", "gpu_compute_ratio")


def check_variants(spec: TaskSpec) -> None:
    """Every bad field of `spec.variants` in one 40003, each named `variants.<i>.<field>`
    (docs/scheduling.md#variants): the same limits as the task's own fields, whole cards or
    a fraction (not both), and no cards named at the top level beside them."""
    if not spec.variants:
        return
    bad: list[tuple[str, str]] = [
        (f, f"{f} is set by each variant when variants are given (leave it out here)")
        for f in VARIANT_CARD_FIELDS
        if getattr(spec, f)
    ]
    for i, var in enumerate(spec.variants):
        at = f"variants.{i}"
        if var.image and (why := image_reference_error(var.image)) is not None:
            bad.append((f"{at}.image", f"variants[{i}].image {why}"))
        if len(var.command) > COMMAND_MAX:
            bad.append((f"{at}.command", f"variants[{i}].command is longer than {COMMAND_MAX}"))
        if len(var.gpu_type) > SHORT_TEXT_MAX:
            bad.append(
                (f"{at}.gpu_type", f"variants[{i}].gpu_type is longer than {SHORT_TEXT_MAX}")
            )
        if var.gpu_memory_mb > INT_FIELD_MAX:
            bad.append((f"{at}.gpu_memory_mb", f"variants[{i}].gpu_memory_mb is too large"))
        if var.gpu_required > 0 and var.is_fractional:
            bad.append(
                (
                    f"{at}.gpu_required",
                    f"variants[{i}]: gpu_required (whole cards) and gpu_memory_mb/"
                    "gpu_compute_ratio (a fraction) are mutually exclusive",
                )
            )
        env = dict(spec.env) | dict(var.env)
        if len(env) > ENV_MAX_ENTRIES or sum(len(k) + len(v) for k, v in env.items()) > (
            ENV_TOTAL_MAX
        ):
            bad.append((f"{at}.env", f"variants[{i}].env with the task's env passes its limits"))
        for key, val in var.env.items():
            if len(key) > ENV_KEY_MAX or len(val) > ENV_VALUE_MAX:
                bad.append((f"{at}.env.{key[:40]}", f"variants[{i}].env {key[:40]!r} is too long"))
    if bad:
        raise DomainError(
            Code.INVALID_VALUE,
            "invalid value: " + "; ".join(msg for _, msg in bad),
            [field for field, _ in bad],
        )


# Label keys the platform keeps for its own names (docs/api.md#reserved-names), compared
# case-insensitively: a tenant's label never reads as the platform's.
RESERVED_LABEL_PREFIX = "heteroflow."


def check_label_keys(labels: Mapping[str, str], field: str = "labels") -> None:
    """40002 naming the first key in the platform's namespace (`heteroflow.`)."""
    for key in labels:
        if key.lower().startswith(RESERVED_LABEL_PREFIX):
            raise DomainError(
                Code.SERVER_OWNED_FIELD,
                f"{field} key {key!r} uses the reserved prefix {RESERVED_LABEL_PREFIX} "
                "(only the platform writes those names)",
                [f"{field}.{key}"],
            )


def _checked_volumes(spec: TaskSpec) -> TaskSpec:
    if len(spec.volumes) > VOLUMES_MAX:
        _refuse("volumes", f"volumes has {len(spec.volumes)} entries, more than {VOLUMES_MAX}")
    volumes, seen = [], set()
    for i, vol in enumerate(spec.volumes):
        if len(vol.host_path) > PATH_MAX:
            _refuse(f"volumes.{i}.host_path", f"host_path is longer than {PATH_MAX} characters")
        try:
            path = normalise_container_path(vol.container_path)
        except ValueError as exc:
            _refuse(f"volumes.{i}.container_path", f"volumes[{i}].{exc}")
        if path in seen:
            _refuse(f"volumes.{i}.container_path", f"volumes[{i}]: {path} is mounted twice")
        seen.add(path)
        volumes.append(vol.model_copy(update={"container_path": path}))
    return spec.model_copy(update={"volumes": tuple(volumes)}) if volumes else spec


def _check_map(field: str, values: Mapping[str, str], entries: int, kmax: int, vmax: int) -> None:
    """Entry count and per-key/per-value lengths of a string map (`env`, `labels`)."""
    if len(values) > entries:
        _refuse(field, f"{field} has {len(values)} entries, more than {entries}")
    for key, val in values.items():
        if not key:
            _refuse(field, f"{field} has an empty key")
        if len(key) > kmax:
            _refuse(f"{field}.{key[:40]}", f"{field} key {key[:40]!r}... is longer than {kmax}")
        if len(val) > vmax:
            _refuse(f"{field}.{key}", f"{field} value of {key!r} is longer than {vmax} characters")


def _refuse(field: str, message: str) -> NoReturn:
    raise DomainError(Code.INVALID_VALUE, message, [field])
