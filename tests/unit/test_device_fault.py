"""Device evidence classification (issue 33 item 3), table-driven with real-looking lines."""

from __future__ import annotations

from typing import Any

import pytest

from libs.domain.task import failure
from libs.domain.task.device_fault import (
    NVIDIA_XIDS,
    XID_CATALOGUE,
    DeviceVerdict,
    classify_device,
)

V = DeviceVerdict
BUS = "0000:3b:00"

CASES: list[tuple[str, dict[str, Any], DeviceVerdict, str, str]] = [
    # (id, inputs, verdict, code, card)
    *[
        (
            f"kernel xid {code}",
            {"log": f"[ 91.2] NVRM: Xid (PCI:{BUS}): {code}, pid=4242, name=python, Ch 0000000b"},
            verdict,
            f"xid:{code}",
            BUS,
        )
        for code, verdict in [
            (13, V.APP_CAUSED),
            (31, V.APP_CAUSED),
            (43, V.APP_CAUSED),
            (45, V.APP_CAUSED),
            (94, V.APP_CAUSED),
            (48, V.DEVICE_FATAL),
            (62, V.DEVICE_FATAL),
            (64, V.DEVICE_FATAL),
            (74, V.DEVICE_FATAL),
            (79, V.DEVICE_FATAL),
            (95, V.DEVICE_FATAL),
            (119, V.DEVICE_FATAL),
            (120, V.DEVICE_FATAL),
            (63, V.UNKNOWN),  # row remapping recorded: informational, not a verdict
        ]
    ],
    (
        "nvml xid event, card from caller",
        {"xids": [79], "card": "2"},
        V.DEVICE_FATAL,
        "xid:79",
        "2",
    ),
    ("nvml app xid", {"xids": [13], "card": "1"}, V.APP_CAUSED, "xid:13", "1"),
    (
        "fallen off the bus without an xid line",
        {"log": "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."},
        V.DEVICE_FATAL,
        "xid:79",
        "0000:3b:00.0",
    ),
    (
        "fatal wins over the app xid that follows it",
        {
            "log": f"NVRM: Xid (PCI:{BUS}): 43, pid=7, Ch 00000010\n"
            f"NVRM: Xid (PCI:{BUS}): 79, pid='<unknown>', GPU has fallen off the bus."
        },
        V.DEVICE_FATAL,
        "xid:79",
        BUS,
    ),
    (
        "contained ecc: xid 94 decides, not the cuda text",
        {
            "log": "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
            f"NVRM: Xid (PCI:{BUS}): 94, pid=88, Contained: SM (0x1). RST: No, D-RST: No"
        },
        V.APP_CAUSED,
        "xid:94",
        BUS,
    ),
    (
        "ecc text alone is the card's",
        {"log": "RuntimeError: CUDA error: uncorrectable ECC error encountered", "card": "0"},
        V.DEVICE_FATAL,
        "ecc:dbe",
        "0",
    ),
    ("nvml double-bit count", {"ecc_double_bit": 2, "card": "3"}, V.DEVICE_FATAL, "ecc:dbe", "3"),
    (
        "ascend hbm multi-bit ecc",
        {"log": "RuntimeError: ACL stream synchronize failed, error code is 507054", "card": "5"},
        V.DEVICE_FATAL,
        "acl:507054",
        "5",
    ),
    (
        "ascend memory uce by name",
        {"log": "ERROR: ACL_ERROR_RT_DEVICE_MEM_ERROR reported by device", "card": "1"},
        V.DEVICE_FATAL,
        "acl:507053",
        "1",
    ),
    (
        "ascend aicore exception is the operator's",
        {"log": "EZ9999: Inner Error! error code is 507015", "card": "0"},
        V.APP_CAUSED,
        "acl:507015",
        "0",
    ),
    (
        "amd ras uncorrectable",
        {
            "log": "amdgpu 0000:c1:00.0: amdgpu: "
            "3 uncorrectable hardware errors detected in umc block"
        },
        V.DEVICE_FATAL,
        "amdgpu:ras",
        "0000:c1:00.0",
    ),
    (
        "amd failed reset",
        {"log": "amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) failed"},
        V.DEVICE_FATAL,
        "amdgpu:ras",
        "0000:c1:00.0",
    ),
    (
        "amd wild access is the app's",
        {
            "log": "Memory access fault by GPU node-2 (Agent handle: 0x55d0) on address 0x7f00. "
            "Reason: Page not present or supervisor privilege.",
            "card": "1",
        },
        V.APP_CAUSED,
        "amdgpu:fault",
        "1",
    ),
    (
        "a plain crash is no device evidence",
        {"log": "Traceback ...\nZeroDivisionError: division by zero", "card": "0"},
        V.UNKNOWN,
        "",
        "0",
    ),
    (
        "gpu oom is not device evidence",
        {"log": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
        V.UNKNOWN,
        "",
        "",
    ),
]


@pytest.mark.parametrize(
    ("inputs", "verdict", "code", "card"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_device_classification(
    inputs: dict[str, Any], verdict: DeviceVerdict, code: str, card: str
) -> None:
    fault = classify_device(**inputs)
    assert (fault.verdict, fault.code, fault.card) == (verdict, code, card)
    assert fault.evidence  # always says why


def test_evidence_quotes_the_log_and_names_the_xid() -> None:
    fault = classify_device(log=f"NVRM: Xid (PCI:{BUS}): 48, pid=1, DBE (0x1)")
    assert "Xid (PCI:0000:3b:00): 48" in fault.evidence
    assert NVIDIA_XIDS[48][1] in fault.evidence


def test_the_issue_examples_are_in_the_table() -> None:
    assert {c for c in (13, 31, 43, 94) if NVIDIA_XIDS[c][0] is V.APP_CAUSED} == {13, 31, 43, 94}
    assert {c for c in (48, 74, 79, 95) if NVIDIA_XIDS[c][0] is V.DEVICE_FATAL} == {48, 74, 79, 95}
    assert "Xid Catalog" in XID_CATALOGUE


def test_reachable_from_the_failure_classifier() -> None:
    assert failure.classify_device is classify_device
    assert failure.DeviceVerdict is DeviceVerdict
