"""Group a py-spy raw profile (`py-spy record -f raw --subprocesses`) into top lines.

    python -m bench.pyspy_top PROFILE.txt [--top N]

Per process: the leaf frames (self time) and the project's frames (inclusive time), each as
a share of that process's samples. Line numbers are dropped, so a function is one row.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

PROJECT = ("services/", "libs/", "agent/", "bench/", "gateway/")
_LINE = re.compile(r":\d+\)")


def parse(path: Path) -> dict[str, list[tuple[list[str], int]]]:
    """Stacks per process: the root process and each child py-spy names."""
    out: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")[1:]  # the first frame names the root process
        name = "root process"
        while frames and frames[0].startswith("process "):  # a child's child: the last names it
            name, frames = frames[0][:60], frames[1:]
        out[name].append(([_LINE.sub(")", f) for f in frames], int(count)))
    return out


def report(stacks: list[tuple[list[str], int]], top: int) -> list[str]:
    total = sum(n for _, n in stacks)
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, n in stacks:
        leaf[frames[-1] if frames else "?"] += n
        for f in set(frames):
            if any(p in f for p in PROJECT):
                inclusive[f] += n
    lines = [f"  samples {total}", "  self (leaf frame):"]
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in leaf.most_common(top)]
    lines.append("  inclusive (project frames):")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    by_process = parse(args.profile)
    for name, stacks in sorted(by_process.items(), key=lambda kv: -sum(n for _, n in kv[1])):
        print(f"== {name}")
        print("\n".join(report(stacks, args.top)))


if __name__ == "__main__":
    main()
