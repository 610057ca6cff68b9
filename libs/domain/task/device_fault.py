"""Device evidence (issue 33 item 3): was a failure the card's fault or the application's?

Pure: kernel log lines (dmesg/journal), the task's output tail, XID codes from NVML events
(or injected by the simulated runtime) and ECC double-bit counts go in; a `DeviceFault`
(verdict + vendor + code + card + the evidence that decided it) comes out. A device-fatal
verdict means the card should be quarantined and the task requeued without charging the
user's retries; an app-caused one stays the user's failure; unknown changes nothing.

NVIDIA XIDs follow `XID_CATALOGUE`: the "Resolution Bucket (Immediate Action)" column of
NVIDIA's Xid Catalog decides. RESTART_APP / IGNORE means the driver contained the fault to
the application (the card is fine) -> app-caused; RESET_GPU / RESTART_BM (reset the card,
reboot the machine) means the card itself is suspect -> device-fatal. Codes not in the table
are unknown: we do not guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

XID_CATALOGUE = (
    "NVIDIA Xid Catalog for Ampere and newer GPUs "
    "(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), "
    "edition online with the R620 driver documentation, read 2026-12"
)


class DeviceVerdict(StrEnum):
    DEVICE_FATAL = "device_fatal"
    APP_CAUSED = "app_caused"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeviceFault:
    verdict: DeviceVerdict
    vendor: str  # "nvidia", "amd", "ascend" or "" when nothing was found
    code: str  # "xid:79", "ecc:dbe", "acl:507054", ... or ""
    card: str  # PCI bus id or device index the evidence names; "" when it names none
    evidence: str  # what decided it, for the quarantine event and the timeline


# code -> (verdict, the catalogue's name for it)
NVIDIA_XIDS: dict[int, tuple[DeviceVerdict, str]] = {
    13: (DeviceVerdict.APP_CAUSED, "Graphics Engine Exception"),
    31: (DeviceVerdict.APP_CAUSED, "GPU memory page fault"),
    43: (DeviceVerdict.APP_CAUSED, "GPU stopped processing"),
    45: (DeviceVerdict.APP_CAUSED, "Preemptive cleanup, due to previous errors"),
    94: (DeviceVerdict.APP_CAUSED, "Contained ECC error"),
    48: (DeviceVerdict.DEVICE_FATAL, "Double Bit ECC Error"),
    62: (DeviceVerdict.DEVICE_FATAL, "Internal micro-controller halt"),
    64: (DeviceVerdict.DEVICE_FATAL, "ECC page retirement or row remapper recording failure"),
    74: (DeviceVerdict.DEVICE_FATAL, "NVLink Error"),
    79: (DeviceVerdict.DEVICE_FATAL, "GPU has fallen off the bus"),
    95: (DeviceVerdict.DEVICE_FATAL, "Uncontained ECC error"),
    119: (DeviceVerdict.DEVICE_FATAL, "GSP RPC Timeout"),
    120: (DeviceVerdict.DEVICE_FATAL, "GSP Error"),
}

# Huawei CANN runtime error codes (rt_error_codes.h), as printed by torch_npu / MindSpore.
ASCEND_CODES: dict[int, tuple[DeviceVerdict, str]] = {
    507015: (DeviceVerdict.APP_CAUSED, "ACL_ERROR_RT_AICORE_EXCEPTION"),
    507053: (DeviceVerdict.DEVICE_FATAL, "ACL_ERROR_RT_DEVICE_MEM_ERROR (memory UCE)"),
    507054: (DeviceVerdict.DEVICE_FATAL, "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR"),
}

# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<card>[0-9A-Fa-f:.]+)\): (?P<code>\d+)")
# "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus." (no XID line on some drivers)
_FELL_OFF = re.compile(
    r"(?:NVRM: GPU (?:at )?(?:PCI:)?(?P<card>[0-9A-Fa-f]{4}:[0-9A-Fa-f:.]+?):?\s+)?"
    r"GPU has fallen off the bus"
)
_NVIDIA_DBE = re.compile(
    r"double[- ]bit ECC|\bDBE\b|uncorrectable ECC error encountered|cudaErrorECCUncorrectable",
    re.I,
)
_ASCEND_CODE = re.compile(r"\b(?P<code>5070(?:15|53|54))\b")
_ASCEND_NAME = re.compile(
    r"ACL_ERROR_RT_(?:AICORE_EXCEPTION|DEVICE_MEM_ERROR|HBM_MULTI_BIT_ECC_ERROR)"
)
_ASCEND_BY_NAME = {name.split(" ")[0]: code for code, (_, name) in ASCEND_CODES.items()}
# amdgpu RAS: "amdgpu 0000:c1:00.0: amdgpu: 3 uncorrectable hardware errors detected in umc block"
_AMD_UE = re.compile(
    r"amdgpu (?P<card>[0-9A-Fa-f:.]+):[^\n]*?(?:\d+ uncorrectable hardware errors? detected"
    r"|GPU reset\(\d+\) failed|Fatal error during GPU init)"
)
# A wild access by the application's kernel, contained to its process (like XID 31).
_AMD_APP = re.compile(r"Memory access fault by GPU node-\d+|amdgpu[^\n]*\[gfxhub\d*\] page fault")


def _nvidia(log: str, xids: Iterable[int], card: str) -> list[DeviceFault]:
    found: list[DeviceFault] = []
    seen: set[int] = set()
    for match in _XID_LINE.finditer(log):
        code = int(match.group("code"))
        seen.add(code)
        found.append(_xid(code, match.group("card"), f"kernel log: {match.group(0)!r}"))
    for code in xids:
        if code not in seen:
            found.append(_xid(code, card, f"NVML XID event {code}"))
    fell = _FELL_OFF.search(log)
    if fell and 79 not in seen:
        found.append(
            DeviceFault(
                DeviceVerdict.DEVICE_FATAL,
                "nvidia",
                "xid:79",
                fell.group("card") or card,
                f"log says {fell.group(0)!r}",
            )
        )
    dbe = _NVIDIA_DBE.search(log)
    if dbe and not seen & {48, 94, 95}:
        # Without an XID we cannot tell a contained error (94) from an uncontained one: the
        # card is quarantined and its health probes decide, at no cost to the user.
        found.append(
            DeviceFault(
                DeviceVerdict.DEVICE_FATAL, "nvidia", "ecc:dbe", card, f"log says {dbe.group(0)!r}"
            )
        )
    return found


def _xid(code: int, card: str, evidence: str) -> DeviceFault:
    verdict, name = NVIDIA_XIDS.get(code, (DeviceVerdict.UNKNOWN, "not in the table"))
    return DeviceFault(verdict, "nvidia", f"xid:{code}", card, f"{evidence} (XID {code}: {name})")


def _ascend(log: str, card: str) -> list[DeviceFault]:
    found: list[DeviceFault] = []
    for match in (*_ASCEND_CODE.finditer(log), *_ASCEND_NAME.finditer(log)):
        text = match.group(0)
        code = int(text) if text.isdigit() else _ASCEND_BY_NAME[text]
        verdict, name = ASCEND_CODES[code]
        found.append(DeviceFault(verdict, "ascend", f"acl:{code}", card, f"output says {name}"))
    return found


def _amd(log: str, card: str) -> list[DeviceFault]:
    found: list[DeviceFault] = []
    ue = _AMD_UE.search(log)
    if ue:
        found.append(
            DeviceFault(
                DeviceVerdict.DEVICE_FATAL,
                "amd",
                "amdgpu:ras",
                ue.group("card"),
                f"kernel log: {ue.group(0)!r}",
            )
        )
    app = _AMD_APP.search(log)
    if app:
        found.append(
            DeviceFault(
                DeviceVerdict.APP_CAUSED, "amd", "amdgpu:fault", card, f"log says {app.group(0)!r}"
            )
        )
    return found


def findings(
    *, log: str = "", xids: Iterable[int] = (), ecc_double_bit: int = 0, card: str = ""
) -> list[DeviceFault]:
    """Every piece of device evidence in the inputs, in the order found."""
    found = _nvidia(log, xids, card) + _ascend(log, card) + _amd(log, card)
    if ecc_double_bit > 0:
        found.append(
            DeviceFault(
                DeviceVerdict.DEVICE_FATAL,
                "nvidia",
                "ecc:dbe",
                card,
                f"NVML reports {ecc_double_bit} double-bit ECC error(s)",
            )
        )
    return found


def classify_device(
    *, log: str = "", xids: Iterable[int] = (), ecc_double_bit: int = 0, card: str = ""
) -> DeviceFault:
    """The decisive finding: any device-fatal one, else any app-caused one, else unknown.

    Device-fatal wins because one bad card among app-looking noise (XID 43 often follows a
    79 on the same channel) must still leave the fleet; `card` is the card the task held,
    used when the evidence itself names none.
    """
    found = findings(log=log, xids=xids, ecc_double_bit=ecc_double_bit, card=card)
    for wanted in (DeviceVerdict.DEVICE_FATAL, DeviceVerdict.APP_CAUSED):
        for fault in found:
            if fault.verdict is wanted:
                return fault
    if found:
        return found[0]
    return DeviceFault(DeviceVerdict.UNKNOWN, "", "", card, "no device evidence")
