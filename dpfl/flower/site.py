"""`python -m dpfl.flower.site SOCKET PID`: a site's worker process (`dpfl.flower.worker`), serving
the ClientApp's training handlers (`dpfl.flower.client.HANDLERS`) until PID is gone."""

from __future__ import annotations

import sys
from pathlib import Path


def _handlers():
    from dpfl.flower.client import HANDLERS

    return HANDLERS


if __name__ == "__main__":
    from dpfl.flower.worker import serve

    serve(Path(sys.argv[1]), int(sys.argv[2]), _handlers)
