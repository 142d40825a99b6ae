"""scaling.md/csv/tex and scaling.png (sweep.scaling = weak | strong): per layout, how throughput per device, MFU,
exposed communication and tokens per joule change with the number of devices, in the form of seed 002's Figure 1.
Efficiency is tokens/s per device relative to the same layout on the fewest devices, paired by seed."""
from __future__ import annotations

from pathlib import Path

from launcher import scheduler as schedulers
from launcher.report import stats
from launcher.report.paper import NAMES
from launcher.report.plots import MARKERS, plt, save_png
from launcher.report.results import group_repeats
from launcher.report.tables import Table, layout_cell

MODES = {"weak": "weak scaling: the batch per device is the same at every size, so the global batch grows",
         "strong": "strong scaling: the global batch is the same at every size, split over more devices"}


def layout_name(r: dict) -> str:
    """What one scaling line is: the strategy, A, the model-parallel degrees and any swept values; F, R and S
    follow from the node count."""
    name = NAMES[r["strategy"]] + (f" A={r['A']}" if r["A"] else "")
    name += "".join(f" {k}={r[k]}" for k in ("tp", "pp") if r[k] > 1)
    return name + "".join(f" {k}={v}" for k, v in sorted(r["axes"].items()))


def scaling_lines(results) -> dict[str, list[dict]]:
    """Table rows (repeats merged) per layout, fewest devices first."""
    lines: dict[str, list[dict]] = {}
    for r in group_repeats(results):
        lines.setdefault(layout_name(r), []).append(r)
    return {name: sorted(rows, key=lambda r: r["world_size"]) for name, rows in sorted(lines.items())}


def _per_device(r: dict) -> dict[int, float]:
    return {k: v / r["world_size"] for k, v in r["tokens_per_s_by_repeat"].items()}


def efficiency(r: dict, base: dict):
    """(ratio, low, high) of tokens/s per device to `base`'s, over the seeds both ran (interval from 2 on)."""
    mine, theirs = _per_device(r), _per_device(base)
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    return stats.paired_ratio([mine[k] for k in seeds], [theirs[k] for k in seeds])


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


SHARED_NOTE = ("{cluster}: every rank runs on one machine ({why}), so once there are more ranks than cores, "
               "throughput per device falls because ranks share cores, not only because of communication.")


def one_machine(cluster) -> str | None:
    """Why every rank of `cluster` runs on one machine, when they do: the local executor, or the SLURM testbed,
    whose nodes are network namespaces of the machine that built them (cluster.network)."""
    if cluster is None:
        return None
    if schedulers.of(cluster).runs_here:
        return "the local executor"
    return "the testbed's nodes are network namespaces of it" if cluster.network is not None else None


def scaling_table(results, mode: str, cluster=None) -> Table:
    lines = scaling_lines(results)
    rows = [(name, r, rows[0]) for name, rows in lines.items() for r in rows]

    def per_device(r):
        values = list(_per_device(r).values())
        return sum(values) / len(values), stats.ci_half_width(values)

    columns = [("Layout", "text", lambda name, r, base: name),
               ("Devices", "auto", lambda name, r, base: r["world_size"]),
               ("(F,R,S)", "text", lambda name, r, base: layout_cell(r)),
               ("Batch per device", "auto", lambda name, r, base: r["batch_per_rank"] // (r["tp"] * r["pp"])),
               ("n", "auto", lambda name, r, base: r["repeats"]),
               ("Tokens/s per device", "count", lambda name, r, base: per_device(r)),
               ("Efficiency", "fixed", lambda name, r, base: efficiency(r, base)),
               ("MFU", "share", lambda name, r, base: r["mfu"]),
               ("Exposed comm (ms/step)", "fixed", lambda name, r, base: _ms(r["exposed_comm_s"])),
               ("Power per device (W)", "fixed", lambda name, r, base: r["avg_power_w_per_device"]),
               ("Tokens/J", "auto", lambda name, r, base: r["tokens_per_j"])]
    table = Table(f"Scaling ({mode}): throughput, MFU, exposed communication and energy per device",
                  [c[0] for c in columns], [[c[2](*row) for c in columns] for row in rows], [c[1] for c in columns])
    table.spread = "ci95"
    table.notes += [MODES[mode] + ".",
                    "Efficiency: tokens/s per device over the same layout's on its fewest devices, the geometric mean "
                    "over the seeds both ran, with its 95 % interval in brackets when two or more did; tokens/s per "
                    "device ± its 95 % half-width over repeats."]
    why = one_machine(cluster)
    if why:
        table.notes.append(SHARED_NOTE.format(cluster=f"cluster={cluster.name}", why=why))
    if all(r["mfu"] is None for _, r, _ in rows):
        table.notes.append("MFU –: the cluster states no peak_flops.")
    table.notes += sorted({f"Energy –: {r['energy_source']}" for _, r, _ in rows if r["energy_j"] is None
                           and r["energy_source"]})
    table.notes += sorted({f"Exposed comm –: {r['exposed_comm_method']}" for _, r, _ in rows
                           if r["exposed_comm_s"] is None and r["exposed_comm_method"]})
    return table


PANELS = (("tokens/s per device", lambda r: r["tokens_per_s"] / r["world_size"]), ("MFU", lambda r: r["mfu"]),
          ("tokens per joule", lambda r: r["tokens_per_j"]))


def scaling_plot(results, mode: str, path: Path) -> Path:
    """Three panels against devices (log 2), a line per layout; a panel with nothing measured says so."""
    lines = scaling_lines(results)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.8))
    for ax, (label, value) in zip(axes, PANELS):
        for i, (name, rows) in enumerate(lines.items()):
            points = [(r["world_size"], value(r)) for r in rows if value(r) is not None]
            if points:
                ax.plot(*zip(*points), marker=MARKERS[i % len(MARKERS)], label=name)
        ax.set(xlabel="devices", ylabel=label, title=label)
        if ax.lines:
            devices = sorted({x for line in ax.lines for x in line.get_xdata()})
            ax.set_xscale("log", base=2)
            ax.set_xticks(devices, [f"{d:g}" for d in devices])
            ax.xaxis.set_minor_locator(plt.NullLocator())
        else:
            ax.set(xticks=[], yticks=[])
            ax.text(0.5, 0.5, "not measured on this cluster", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{mode.capitalize()} scaling", fontsize=10)
    return save_png(fig, path)
