"""Closed integer intervals (start, end)."""


def merge(intervals):
    """Merge overlapping intervals; returns a sorted list of tuples."""
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))
