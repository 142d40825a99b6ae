"""Parsers for the text `scontrol` prints (pure: no process is run here; launcher.slurm.scontrol runs it).

Written against captures from SLURM 22.05.8 (tests/fixtures) and the formats of later releases (block
topology from 23.11, aggregated blocks from 24.11). Unknown fields are kept, because every SLURM release
adds some; anything that cannot be read raises ParseError naming the line, so a placement is never built
on a guess.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from launcher.slurm.hostlist import ParseError, expand

# A field starts at the line start or after whitespace; keys may hold ':' and '/' (AllocNode:Sid, CPUs/Task).
# Records are split at the blanks before each key of " " + record: a pattern that starts with a literal space
# lets the regex engine jump from blank to blank (3x faster on 40-field node records than a look-behind tested
# at every position, bench.plan_speed); a record with tabs or anything unprintable takes the general pattern.
_KEY = re.compile(r" \s*([A-Z][A-Za-z0-9_:/]*)=")
_KEY_ANY_BLANK = re.compile(r"\s+([A-Z][A-Za-z0-9_:/]*)=")

# Base states `scontrol show node` can print: 21.08+ prints the base state (node_state_base_string) then
# +FLAG for each flag; older releases printed compound names (DRAINED, DRAINING, MAINT, ...) with a
# trailing '*' for a node that does not respond. sinfo's spellings (ALLOC, INVAL, NPC...) are accepted too.
_KNOWN_STATES = frozenset("""
    IDLE MIXED ALLOCATED ALLOC DOWN ERROR FUTURE UNKNOWN INVALID INVAL COMPLETING DRAIN DRAINED DRAINING
    FAIL FAILING MAINT PLANNED POWER_DOWN POWERED_DOWN POWERING_DOWN POWER_UP POWERING_UP REBOOT
    REBOOT_REQUESTED REBOOT_ISSUED RESERVED BLOCKED CLOUD INVALID_REG NO_RESPOND PERFCTRS NPC RESUME UNDRAIN
""".split())
# Flags that say nothing about availability: CLOUD only marks a cloud node (its power state is a flag of its
# own) and DYNAMIC_NORM a node added with `scontrol create node`. Every other flag in SLURM's node state list
# keeps new work off the node or means it is not up right now: DRAIN, FAIL, MAINTENANCE, RESERVED, PLANNED
# (held for a pending job), REBOOT_*, INVALID_REG, NOT_RESPONDING, POWER*/POWERED_DOWN, DYNAMIC_FUTURE, and
# COMPLETING (an epilog still running; nodes can stick in it). Flags of future releases count as unusable too.
_HARMLESS_FLAGS = frozenset({"CLOUD", "DYNAMIC_NORM"})
_FAMILY = {"SwitchName": "switch", "BlockName": "block", "AggregatedBlock": "block"}


@dataclass
class Switch:
    """One `scontrol show topology` line of topology/tree, hostlists expanded."""
    name: str
    level: int
    link_speed: int
    nodes: list[str]
    switches: list[str]
    extra: dict = field(default_factory=dict)


@dataclass
class Block:
    """One line of topology/block: a base block, or (24.11+) an aggregation of consecutive blocks."""
    name: str
    index: int
    nodes: list[str]
    size: int
    aggregated: bool


@dataclass
class Node:
    """One `scontrol show node` record; `fields` keeps every raw field."""
    name: str
    state: str
    flags: set[str]
    gpus: int
    partitions: list[str]
    fields: dict

    @property
    def usable(self) -> bool:
        """Ranks may be placed here now: IDLE or MIXED with no flag that keeps work off it."""
        return self.state in ("IDLE", "MIXED") and self.flags <= _HARMLESS_FLAGS

    @property
    def gpus_used(self) -> int | None:
        """GPUs allocated now: GresUsed= (`scontrol -d show node`), else AllocTRES's gres/gpu, else none on an
        IDLE node; None when the record does not say (MIXED or ALLOCATED without either field)."""
        if "GresUsed" in self.fields:
            return _gpus(self.fields["GresUsed"], self.name, 0)
        alloc = dict(item.split("=", 1) for item in self.fields.get("AllocTRES", "").split(",") if "=" in item)
        if "gres/gpu" in alloc and alloc["gres/gpu"].isdigit():
            return int(alloc["gres/gpu"])
        return 0 if self.state == "IDLE" else None

    @property
    def cpus_free(self) -> int | None:
        """CPUTot - CPUAlloc, when the record has both."""
        total, alloc = self.fields.get("CPUTot", ""), self.fields.get("CPUAlloc", "")
        return int(total) - int(alloc) if total.isdigit() and alloc.isdigit() else None

    def not_free(self, gpus: int, cpus: int) -> str | None:
        """Why this node cannot take one node's share of a job now (`gpus` GPUs, `cpus` CPUs), as a reason
        class for the plan's count of excluded nodes; None when it can."""
        if not self.schedulable:
            return "down or drained"
        if not self.usable:
            return "allocated"
        if gpus:
            used = self.gpus_used
            if used is None:
                return "GPU use unknown (MIXED without GresUsed: capture with `scontrol -d -o show node`)"
            if self.gpus - used < gpus:
                return f"fewer than {gpus} GPUs free"
        free = self.cpus_free
        if free is not None and free < cpus:
            return f"fewer than {cpus} CPUs free"
        return None

    @property
    def schedulable(self) -> bool:
        """A job may get this node once running work ends: busy is fine, drained or down is not."""
        return self.state in ("IDLE", "MIXED", "ALLOCATED", "ALLOC") and \
            self.flags <= _HARMLESS_FLAGS | {"COMPLETING"}


def parse_partitions(text: str) -> dict[str, dict]:
    """PartitionName -> its fields, from `scontrol [-o] show partition` (one-line or multi-line records)."""
    records = [" ".join(r.split()) for r in re.split(r"(?m)^\s*(?=PartitionName=)", text) if r.strip()]
    return {fields["PartitionName"]: fields for fields in map(parse_key_values, records)}


def parse_key_values(text: str) -> dict:
    """`Key=Value ...` fields of one SLURM record; values may hold spaces (OS=, Reason=) or be empty.

    A value runs until the next ` Key=` whose key starts with an uppercase letter, so a value that
    itself holds ` Upper=` would be split there; SLURM prints no such field in the formats read here.
    """
    record = " " + text.strip()
    key = _KEY if record.isprintable() else _KEY_ANY_BLANK  # isprintable: no blank but " " (no tab, newline...)
    parts = key.split(record)  # [lead, key, value, key, value, ...]: C-level passes only (100,000-node snapshots)
    if len(parts) == 1:
        raise ParseError(f"no Key=Value field in {text.strip()!r}")
    lead = parts[0].strip()
    if lead:
        raise ParseError(f"text {lead!r} before the first Key=Value field")
    keys, values = parts[1::2], parts[2::2]  # the blanks before a key went with the split; after '=', strip them
    fields = dict(zip(keys, values if key is _KEY and "= " not in record else map(str.strip, values)))
    if len(fields) != len(keys):
        seen: set[str] = set()
        twice = next(k for k in keys if k in seen or seen.add(k))
        raise ParseError(f"field {twice}= appears twice")
    return fields


def parse_topology_tree(text: str) -> list[Switch]:
    """`SwitchName=... Level=... LinkSpeed=... [Nodes=...] [Switches=...]` lines (topology/tree)."""
    switches: list[Switch] = []
    seen: set[str] = set()
    for n, line, fields in _lines(text):
        if next(iter(fields)) != "SwitchName":
            raise ParseError(f"line {n}: not a SwitchName= line: {line.strip()!r}")
        f = dict(fields)
        name = f.pop("SwitchName")
        if name in seen:
            raise ParseError(f"line {n}: switch {name} listed twice: {line.strip()!r}")
        seen.add(name)
        switches.append(Switch(name=name, level=_int(f.pop("Level", None), "Level", n, line),
                               link_speed=_int(f.pop("LinkSpeed", None), "LinkSpeed", n, line),
                               nodes=_hosts(f.pop("Nodes", ""), n, line),
                               switches=_hosts(f.pop("Switches", ""), n, line), extra=f))
    return switches


def parse_topology_block(text: str) -> list[Block]:
    """topology/block lines (23.11+), in output order; BlockIndex is SLURM's own order and is exposed as is.

    `BlockName=b1 BlockIndex=0 Nodes=... BlockSize=2`, and from 24.11 `AggregatedBlock=b[1-2] BlockIndex=4
    Nodes=... BlockSize=4` whose name is the hostlist of the blocks it joins. 23.11 prints no BlockSize;
    the node count stands in for it then.
    """
    blocks: list[Block] = []
    for n, line, fields in _lines(text):
        kind = next(iter(fields))
        if kind not in ("BlockName", "AggregatedBlock"):
            raise ParseError(f"line {n}: not a BlockName= or AggregatedBlock= line: {line.strip()!r}")
        nodes = _hosts(fields.get("Nodes", ""), n, line)
        size = fields.get("BlockSize")
        blocks.append(Block(name=fields[kind], index=_int(fields.get("BlockIndex"), "BlockIndex", n, line),
                            nodes=nodes, size=len(nodes) if size is None else _int(size, "BlockSize", n, line),
                            aggregated=kind == "AggregatedBlock"))
    return blocks


def parse_topology(text: str) -> list[Switch] | list[Block]:
    """Tree or block topology, whichever `text` holds (empty text: no topology, [])."""
    first = None
    for n, line, fields in _lines(text):
        family = _FAMILY.get(next(iter(fields)))
        if family is None:
            raise ParseError(f"line {n}: neither a switch nor a block line: {line.strip()!r}")
        if first and family != first:
            raise ParseError(f"line {n}: {family} line in a {first} topology: {line.strip()!r}")
        first = family
    return parse_topology_block(text) if first == "block" else parse_topology_tree(text)


def parse_nodes(text: str) -> list[Node]:
    """`scontrol show node` (records split by blank lines, indented continuations) or `scontrol -o show node`."""
    nodes: list[Node] = []
    for n, record in _records(text):
        try:
            fields = parse_key_values(record)
        except ParseError as e:
            raise ParseError(f"line {n}: {e}: {record.strip()[:200]!r}") from None
        if next(iter(fields)) != "NodeName":
            raise ParseError(f"line {n}: record does not start with NodeName=: {record.strip()[:200]!r}")
        name = fields["NodeName"]
        if "State" not in fields:
            raise ParseError(f"line {n}: node {name} has no State= field")
        state, flags = _state(fields["State"], name, n)
        nodes.append(Node(name=name, state=state, flags=flags, gpus=_gpus(fields.get("Gres", ""), name, n),
                          partitions=[p for p in fields.get("Partitions", "").split(",") if p],
                          fields=fields))
    return nodes


def _lines(text: str):
    """(line number, line, fields) of every non-blank line."""
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, line, parse_key_values(line)
            except ParseError as e:
                raise ParseError(f"line {n}: {e}: {line.strip()!r}") from None


def _records(text: str) -> list[tuple[int, str]]:
    """(first line number, joined text) per record; a line boundary is always a field boundary."""
    records: list[tuple[int, list[str]]] = []
    open_record = False
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            open_record = False
        elif line[0].isspace():
            if not open_record:
                raise ParseError(f"line {n}: indented line outside a record: {line.strip()!r}")
            records[-1][1].append(line)
        else:
            records.append((n, [line]))
            open_record = True
    return [(n, " ".join(lines)) for n, lines in records]


def _int(value: str | None, key: str, n: int, line: str) -> int:
    if value is None or not value.isdigit():
        what = "missing" if value is None else f"not a number ({value!r})"
        raise ParseError(f"line {n}: {key}= {what}: {line.strip()!r}")
    return int(value)


def _hosts(value: str, n: int, line: str) -> list[str]:
    if value in ("", "(null)"):
        return []
    try:
        return expand(value)
    except ParseError as e:
        raise ParseError(f"line {n}: {e}: {line.strip()!r}") from None


def _state(value: str, name: str, n: int) -> tuple[str, set[str]]:
    """('IDLE', {'DRAIN'}) from 'IDLE+DRAIN'; a trailing '*' (DOWN*) is the NOT_RESPONDING flag."""
    base, *rest = value.split("+")
    flags: set[str] = set()
    for part in [base, *rest]:
        if part.endswith("*"):
            flags.add("NOT_RESPONDING")
    base = base.rstrip("*")
    if base not in _KNOWN_STATES:
        raise ParseError(f"line {n}: node {name} has unknown state {base!r} (State={value})")
    for flag in (p.rstrip("*") for p in rest):
        if not flag:
            raise ParseError(f"line {n}: node {name} has an empty flag in State={value}")
        flags.add(flag)
    return base, flags


def _gpus(gres: str, name: str, n: int) -> int:
    """GPUs in Gres=: gpu:4, gpu:a100:4, gpu:a100:4(S:0-1), gpu:a100:2,gpu:h100:2; (null) is none."""
    try:
        return _gpu_count(gres)
    except ParseError as e:
        raise ParseError(f"line {n}: node {name}: {e}") from None


@functools.lru_cache(maxsize=256)
def _gpu_count(gres: str) -> int:
    """A cluster's nodes share a few Gres strings: each is parsed once."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres):  # commas inside (S:0,2) do not separate
        kind, *rest = re.sub(r"\(.*\)$", "", item).split(":")
        if kind != "gpu":
            continue
        if not rest or not rest[-1].isdigit():
            raise ParseError(f"no GPU count in Gres item {item!r}")
        total += int(rest[-1])
    return total
