"""SLURM hostlist expressions, expanded and compressed exactly as SLURM 22.05 does.

`expand` follows src/common/hostlist.c of 22.05 (checked against real `scontrol show
hostnames` output in tests/fixtures/hostlist_cases.tsv):

* the width of a range is the length of its start: ``n[9-11]`` -> n9 n10 n11,
  ``n[09-11]`` -> n09 n10 n11;
* with several bracket groups the last one varies fastest and the others nest from
  the second-to-last (slowest) down to the first: ``a[1-2]b[1-2]c[1-2]`` ->
  a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ... (SLURM's order, not lexicographic);
* text after the last ``]`` (``n[1-2]x``, ``node[1-3,5]-ib``) is an error in 22.05,
  so it is one here, although 25.11 (and python-hostlist) accept it.

Stricter than SLURM where SLURM silently guesses: empty items, empty or descending
ranges, nested or unbalanced brackets all raise ParseError, because a topology parsed
from a guess places ranks on the wrong switches. As SLURM, a range holds at most 65,536
hosts (``n[1-65537]`` is an invalid hostlist to scontrol) and only ASCII digits are
numbers (``a[٣-٥]`` is invalid, ``n١`` one literal host); a whole expression expands to at
most MAX_HOSTS hosts, refused before any is made.
"""
from __future__ import annotations

import re
from itertools import product

from train.contract.common import ConfigError

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")  # ASCII digits only: \d would take ٣ (Arabic-Indic three) too
_NUMERIC_TAIL = re.compile(r"(.*?)([0-9]+)")
MAX_RANGE = 65536  # hosts in one range: SLURM's hostlist.c refuses more (scontrol: "Invalid hostlist")
MAX_HOSTS = 1 << 20  # hosts one expression may expand to: far above any cluster, far below a MemoryError
_GROUP = re.compile(r"\[([^\[\]]*)\]")


class ParseError(ConfigError):
    """SLURM output or a hostlist could not be understood; the message names the offending part."""


def expand(expr: str) -> list[str]:
    """Every host of `expr`, in SLURM's order (duplicates kept, as `scontrol show hostnames` does)."""
    if not expr.strip():
        raise ParseError("empty hostlist")
    items = _split_items(expr)
    total = sum(_count(item, expr) for item in items)
    if total > MAX_HOSTS:
        raise ParseError(f"hostlist {expr[:60]!r}{'...' if len(expr) > 60 else ''} expands to {total:,} hosts, "
                         f"more than the {MAX_HOSTS:,} fedshard accepts")
    hosts: list[str] = []
    for item in items:
        hosts.extend(_expand_item(item, expr))
    return hosts


def _count(item: str, expr: str) -> int:
    """How many hosts an item expands to, from its ranges alone (each checked against SLURM's MAX_RANGE)."""
    count = 1
    for group in _GROUP.findall(item):
        count *= sum(hi - lo + 1 for lo, hi, _ in _ranges(group, item, expr))
    return count


def compress(hosts: list[str]) -> str:
    """A hostlist that `expand` maps back to `hosts` in the same order.

    Consecutive hosts sharing a prefix become one bracket group; ascending runs with the
    same zero padding become ranges (lrdn[0001-0004,0007]) of at most MAX_RANGE hosts, so
    SLURM reads them back. Order wins over compactness:
    hosts are never sorted or merged across a different prefix.
    """
    items: list[tuple[str, list[list[int]]]] = []  # (prefix, [[lo, hi, width], ...]); width -1: no number
    for host in hosts:
        if not host or re.search(r"[\[\],\s]", host):
            raise ParseError(f"cannot compress host name {host!r}")
        m = _NUMERIC_TAIL.fullmatch(host)
        prefix, digits = (m.group(1), m.group(2)) if m else (host, "")
        num, width = (int(digits), len(digits)) if digits else (0, -1)
        if width >= 0 and items and items[-1][0] == prefix and items[-1][1][-1][2] >= 0:
            last = items[-1][1][-1]
            if num == last[1] + 1 and f"{num:0{last[2]}d}" == digits and last[1] - last[0] + 1 < MAX_RANGE:
                last[1] = num
            else:
                items[-1][1].append([num, num, width])
        else:
            items.append((prefix, [[num, num, width]]))
    return ",".join(_item_text(prefix, ranges) for prefix, ranges in items)


def _item_text(prefix: str, ranges: list[list[int]]) -> str:
    parts = [f"{lo:0{w}d}" if lo == hi else f"{lo:0{w}d}-{hi:0{w}d}" for lo, hi, w in ranges if w >= 0]
    if not parts:
        return prefix
    if len(parts) == 1 and "-" not in parts[0]:
        return prefix + parts[0]
    return f"{prefix}[{','.join(parts)}]"


def _split_items(expr: str) -> list[str]:
    """Top-level comma-separated items; brackets must balance and never nest."""
    items, start, open_at = [], 0, -1
    for i, ch in enumerate(expr):
        if ch == "[":
            if open_at >= 0:
                raise ParseError(f"nested '[' at position {i} in hostlist {expr!r}")
            open_at = i
        elif ch == "]":
            if open_at < 0:
                raise ParseError(f"']' without '[' at position {i} in hostlist {expr!r}")
            open_at = -1
        elif ch == "," and open_at < 0:
            items.append(expr[start:i])
            start = i + 1
        elif ch.isspace():
            raise ParseError(f"whitespace at position {i} in hostlist {expr!r}")
    if open_at >= 0:
        raise ParseError(f"unclosed '[' at position {open_at} in hostlist {expr!r}")
    items.append(expr[start:])
    for item in items:
        if not item:
            raise ParseError(f"empty item in hostlist {expr!r}")
    return items


def _expand_item(item: str, expr: str) -> list[str]:
    pieces = _GROUP.split(item)  # literal, group, literal, group, ..., literal
    literals, groups = pieces[0::2], pieces[1::2]
    if not groups:
        return [item]
    if literals[-1]:
        raise ParseError(f"invalid hostlist {expr!r}: text {literals[-1]!r} after the last ']' "
                         f"in {item!r} (SLURM 22.05 rejects it; 25.11 accepts it)")
    values = [_numbers(group, item, expr) for group in groups]
    *outer, last = values
    if not outer:  # the common case, kept a single comprehension for 100k-node ranges
        return [literals[0] + v for v in last]
    hosts: list[str] = []
    for combo in product(*reversed(outer)):  # second-to-last group slowest, first group fastest
        head = "".join(lit + v for lit, v in zip(literals, reversed(combo))) + literals[-2]
        hosts.extend([head + v for v in last])
    return hosts


def _ranges(group: str, item: str, expr: str) -> list[tuple[int, int, int]]:
    """(lo, hi, width) of each range of one bracket group, e.g. '0001-0003,0200'."""
    out = []
    for part in group.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            what = "empty range" if not part else f"non-numeric range {part!r}"
            raise ParseError(f"{what} in [{group}] of hostlist {expr[:80]!r}")
        lo, hi, width = int(m.group(1)), int(m.group(2) or m.group(1)), len(m.group(1))
        if lo > hi:
            raise ParseError(f"descending range {part!r} in {item[:80]!r} of hostlist {expr[:80]!r}")
        if hi - lo + 1 > MAX_RANGE:
            raise ParseError(f"range {part!r} in {item[:80]!r} holds {hi - lo + 1:,} hosts; SLURM refuses more than "
                             f"{MAX_RANGE:,} in one range")
        out.append((lo, hi, width))
    return out


def _numbers(group: str, item: str, expr: str) -> list[str]:
    """The zero-padded numbers of one bracket group."""
    return [f"{n:0{width}d}" for lo, hi, width in _ranges(group, item, expr) for n in range(lo, hi + 1)]
