"""Results of a compare run, read back for its report.

Each line of the results file is NAME <tab> KEY <tab> VALUE; a run of
several rounds writes one line per round for every measured key. `load`
gives, per name and key, the median of the numeric values (or the last
value, for text such as a version) and the values round by round.
"""

import statistics
from collections import defaultdict


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def fmt_int(x):
    """A whole number with thin groups of three ("12 345"), or "-"."""
    v = num(x)
    return "-" if v is None else f"{round(v):,}".replace(",", " ")


def load(path):
    by_round = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        name, key, value = line.rstrip("\n").split("\t", 2)
        by_round[name][key].append(value)
    summary = defaultdict(dict)
    for name, keys in by_round.items():
        for key, values in keys.items():
            numbers = [num(v) for v in values]
            if all(n is not None for n in numbers):
                summary[name][key] = str(statistics.median(numbers))
            else:
                summary[name][key] = values[-1]
    return summary, by_round


def round_ratios(by_round, name, ref, key):
    """name's value over ref's, round by round (None where either is missing)."""
    a = [num(v) for v in by_round.get(name, {}).get(key, [])]
    b = [num(v) for v in by_round.get(ref, {}).get(key, [])]
    return [x / y if x is not None and y else None for x, y in zip(a, b)]


def spread(ratios):
    """'median (min–max)' of the ratios that exist, or '-'."""
    xs = [x for x in ratios if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.2f}×"
    return f"{statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})"
