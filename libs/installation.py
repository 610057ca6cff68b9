"""The installation id: a random id made once per platform installation, kept in its home.

Every agent `heteroflow up` starts shares the home and so the id; containers carry it as a
label, and an agent adopts only containers of its own installation, so two installations on
one Docker engine with the same node names never take each other's work. An agent with a home
of its own is given the platform's id with `HETEROFLOW_INSTALLATION_ID`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

FILE = "installation_id"


def installation_id(home: Path) -> str:
    """The id kept in `home`, created there on first use (atomically: the first writer wins)."""
    path = home / FILE
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(8) + "\n")
    return path.read_text().strip()
