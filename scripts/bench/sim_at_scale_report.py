"""The assumptions ``sim_at_scale.py`` prints above its tables, and the marks its cells carry."""

from __future__ import annotations

import dataclasses
import time

from mpipe_hf.schedule import ScheduleConfig
from mpipe_hf.schedule.hardware import GIB, Cluster, Workload

HAS_ZB = "zero_bubble" in {f.name for f in dataclasses.fields(ScheduleConfig)}
RECOMPUTE = "†"  # the cell needed activation recomputation (decoder layers, and a trainable tower) to fit
TOWER_RECOMPUTE = "*"  # the cell needed the trainable tower's activation recomputation to fit
BY_COUNT = "‡"  # the cell needed the layout by count (not by cost) to fit


def assumptions(cluster: Cluster, workload: Workload, vpp: int, measured: str | None, vision, caps) -> list[str]:
    """The assumptions the tables rest on, one line each."""
    latency_nv, bw_nv = cluster.link(True)
    latency_ib, bw_ib = cluster.link(False)
    fill_cap, zb_cap = caps
    out = [
        f"GPU: {cluster.name}; {cluster.gpus_per_node} GPUs per node, each pipeline on consecutive GPUs "
        f"(a pipeline of pp <= {cluster.gpus_per_node} inside one node).",
        (f"compute: the measured profile {measured} (its link figures replaced by the ones below; the weight "
         f"gradient taken as half of each backward)" if measured else
         f"compute: {cluster.peak_flops / 1e12:.1f} TFLOPS dense bf16 peak (datasheet) at "
         f"{cluster.compute_efficiency:.0%} achieved = {cluster.flops_per_s / 1e12:.0f} TFLOPS per GPU, applied to "
         f"the matmul FLOPs of each layer (2 x weights x tokens + causal attention 2 x heads x dim x L^2 forward; "
         f"backward 2x; the weight-gradient part 2 x weights x tokens); norms, rotary, embedding and loss cost 0 "
         f"(absorbed in the efficiency); data loading is free (a dataloader's work, overlapped)."),
        f"pipeline P2P: NVLink 4, {cluster.nvlink_bytes_per_s / 1e9:.0f} GB/s per direction (900 GB/s bidirectional"
        f" per GPU) at {cluster.nvlink_efficiency:.0%} = {bw_nv / 1e9:.0f} GB/s, {latency_nv * 1e6:.0f} us per "
        f"transfer; a pipeline longer than a node takes InfiniBand for every transfer (conservative). Body "
        f"messages are the bf16 hidden states of a micro-batch, P's output the bf16 image features.",
        f"data parallel: ZeRO-1 (AdamW states sharded over dp): ring reduce-scatter of bf16 gradients + ring "
        f"all-gather of bf16 weights after each rank's last action, not overlapped; over NVLink when the dp group "
        f"is inside a node, else NDR InfiniBand {cluster.ib_bytes_per_s * 8 / 1e9:.0f} Gb/s per GPU at "
        f"{cluster.ib_efficiency:.0%} = {bw_ib / 1e9:.0f} GB/s, {latency_ib * 1e6:.0f} us per ring step. The "
        f"optimizer update itself is left out. \"ZeRO-1 sync s\": the slowest rank's exchange.",
        f"memory: {cluster.memory_budget_bytes / GIB:.0f} GiB per rank ({cluster.memory_bytes / GIB:.0f} GiB less "
        f"{cluster.memory_headroom:.0%}): trained parameters 2 (bf16 weight) + 2 (bf16 gradient) + 12 / dp (fp32 "
        f"master weight, Adam moments) bytes, frozen ones 2, plus the schedule's activation peak (bf16 activations, "
        f"fused attention; the walk of every rank's actions). A cell that does not fit is retried with the trainable "
        f"tower's activations recomputed (marked {TOWER_RECOMPUTE}: each tower block keeps its input, its backward "
        f"reruns its forward), then with the decoder layers' too (marked {RECOMPUTE}); cells marked {BY_COUNT} the layout by count instead of by cost (the cost-balanced layout can load "
        f"one rank with more layers); OOM (GiB): not even then. In parentheses: the fullest rank's GiB.",
        f"workload: {workload.tokens} tokens per sample, {workload.images} images of {workload.image_height}x"
        f"{workload.image_width} per sample"
        + (f" = {workload.image_tokens(vision)} image tokens ({workload.patches(vision)} patches)" if vision else "")
        + f"; micro-batch {workload.micro_batch} sample; global batch {workload.global_batch} samples; "
        f"M = global batch / dp per replica; V = {vpp} model chunks per rank.",
        "schedules: 1F1B = our interleaved 1F1B with the tower inside stage 0 (layers by count; \"rebalanced\": by "
        "cost, the tower counted on stage 0). ZB = the same with zero_bubble=True (our ZB-H1 body: "
        "mpipe_hf.schedule.zero_bubble), the stand-in for torch's ScheduleInterleavedZeroBubble, which the "
        "simulator cannot run; rebalanced layout. MPipe = MPipe Transpose, overflow full, layout balanced by "
        "cost (stage 0 counts the embedding, and a trainable tower's recompute and backward, which rank 0 runs "
        "for every micro-batch without owner-backward); fill = bubble filling in its steady state (the next step's tower forwards in this step); ZB = "
        "zero_bubble=True; owner-bwd = owner-backward (trainable tower).",
        "MPipe vs best baseline = the fastest baseline's step / the fastest MPipe variant's step (> 1: MPipe faster).",
        f"capped: placement fill is simulated up to M x pp = {fill_cap}, zero-bubble and owner-backward up to "
        f"M x pp = {zb_cap} (--fill-max-work, --zb-max-work), to keep the script under two minutes: fill's greedy "
        f"pass simulates the step once per candidate position of every micro-batch (about 12 s of CPU at M = 32, "
        f"pp = 8 and 50 s at M = 32, pp = 16), and the weight placement (zero-bubble's W, owner-backward's tower "
        f"backward) relists and resimulates the whole schedule until it settles (about 8 s at M = 128, pp = 8).",
    ]
    if not HAS_ZB:
        out.append("ZB columns absent: this checkout's ScheduleConfig has no zero_bubble field.")
    return out


def render(rows: list, results: dict, indices: list[int], tower: str, variants: list, baselines: set) -> tuple[str, list[str]]:
    """One markdown table (rows: N, dp x pp; columns: the schedules that apply) and its notes."""
    columns = [j for j, v in enumerate(variants) if v.applies(tower)]
    head = ["GPUs", "dp x pp", "M", "ZeRO-1 sync s"] + [variants[j].title for j in columns] + [
        "MPipe vs best baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for i in indices:
        row = rows[i]
        if row.skip:
            notes.append(f"N = {row.gpus}, {row.dp} x {row.pp}: {row.skip}")
            if row.floor:
                lines.append(f"| {row.gpus} | {row.dp} x {row.pp} | {row.micro} | – | "
                             + " | ".join([f"OOM (≥{row.floor / GIB:.0f})"] * len(columns)) + " | – |")
            continue
        cells = {j: results[(i, j)] for j in columns}
        for j, cell in cells.items():
            if cell.get("why"):
                notes.append(f"N = {row.gpus}, {row.dp} x {row.pp}, {variants[j].title}: not built ({cell['why']})")
        base = [c["step"] for j, c in cells.items() if variants[j].title in baselines and c["step"]]
        ours = [c["step"] for j, c in cells.items() if variants[j].title not in baselines and c["step"]]
        ratio = f"{min(base) / min(ours):.3f}x" if base and ours else "–"
        sync = next((c["sync"] for c in cells.values() if c.get("sync") is not None), None)
        lines.append(f"| {row.gpus} | {row.dp} x {row.pp} | {row.micro} | {'–' if sync is None else f'{sync:.3f}'} | "
                     + " | ".join(cells[j]["text"] for j in columns) + f" | {ratio} |")
    return "\n".join(lines), notes


def report(runs, headers, rows, results, args, cluster, workload, vision, started, variants, baselines) -> str:
    """The printed output: the assumptions, then one table per model and tower mode with its notes."""
    out = []
    for title, _, _ in runs:
        out += [headers[title]]
        for tower in args.towers:
            indices = [i for i, r in enumerate(rows) if r.model == title and r.tower == tower]
            body, notes = render(rows, results, indices, tower, variants, baselines)
            out += ["", f"{tower} tower (step seconds, and the fullest rank's GiB):", "", body]
            out += [f"- {n}" for n in notes]
        out.append("")
    text_out = "\n".join(["Assumptions:", ""] + [f"- {a}" for a in assumptions(
        cluster, workload, args.vpp, args.profile, vision, (args.fill_max_work, args.zb_max_work))] + [""]
        + out + [f"({time.time() - started:.0f} s in all, {args.jobs} worker processes)"])
    return text_out
