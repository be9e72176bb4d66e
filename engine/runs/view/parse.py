"""Reading an event's fields: an events file is input like any other, so a field of the wrong
type reads as its default (or makes the event Malformed, which the reducer counts and skips)."""
from __future__ import annotations

from ... import fmt


class Malformed(ValueError):
    pass



real = fmt.real  # the one number parser (a local name: the reducer runs it on every event)


def whole(v, default: int = 0) -> int:
    if isinstance(v, bool):
        return default
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def rank_of(v) -> int:
    """A rank is a whole number; anything else makes the event malformed."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise Malformed(f"bad rank {v!r}")
    try:
        r = int(v)
    except (TypeError, ValueError, OverflowError):
        raise Malformed(f"bad rank {v!r}") from None
    if r < -1 or r > 1 << 20:
        raise Malformed(f"bad rank {v!r}")
    return r


def as_text(v, default: str = "") -> str:
    return default if v is None else str(v)


def read_memory(st, ev: dict) -> None:
    """A rank's device_mem_mb and peak_mem_mb from its step event (or an old run's rank_report row)."""
    mem = real(ev.get("device_mem_mb"))
    if mem is not None:
        st.device_mem_mb = mem
    peak = real(ev.get("peak_mem_mb"))
    if peak is not None:
        st.peak_mem_mb = max(peak, st.peak_mem_mb or 0.0)
    high = peak if peak is not None else mem  # runs from before peak_mem_mb
    if high is not None:
        st.mem_high_mb = max(high, st.mem_high_mb or 0.0)


def numbers(v) -> dict:
    """An event's {name: number} (metrics, val_metrics): the names whose values are numbers."""
    if not isinstance(v, dict):
        return {}
    out = {}
    for k, x in v.items():
        x = real(x)
        if x is not None:
            out[str(k)] = x
    return out

