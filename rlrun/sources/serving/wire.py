"""What the policy server and its client both need to speak protocol version 1, kept to the standard
library and numpy so the client in remote mode imports neither gymnasium nor torch."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

PROTOCOL = 1
PREFIX = f"/v{PROTOCOL}/"
SERVER_HEADER = "x-rlrun-server"  # an id that changes when the server restarts


def encode_array(a: np.ndarray) -> str:
    """An array's raw little-endian values as base64 (its dtype and shape travel beside it)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()).decode()


def decode_array(data: str, dtype: Any, shape: Any) -> np.ndarray:
    """The inverse of ``encode_array``."""
    dt = np.dtype(dtype)
    return np.frombuffer(base64.b64decode(data), dtype=dt.newbyteorder("<")).astype(dt).reshape(shape)
