#!/usr/bin/env python3
"""Summary of a gmm_bench run: markdown tables (geometric means, then one per pass), a PNG chart.

    bench/compare.py results.json [--chart docs/performance.png]
    bench/compare.py --run build/release/bench/gmm_bench [--json out.json] [--chart c.png] \
        [-- gmm_bench arguments, e.g. --quick]

Rows are shape x recipe, columns the gmm families and the baselines; a family's cell is its
GFLOP/s and its ratio to the row's best baseline (the baselines of the same recipe; for the fp8
recipes, the naive fp8 path and oneDNN bf16, the unquantized alternative). A last table puts v2
against its one-thread column (v2-1thread) where the run has it; a first one puts the probes
of the start of the run against their benchmarks interleaved with it (probe/...). With
--benchmark_repetitions, each cell is its median. Optional tool: tests and CI do not need it.
Standard library only, plus gnuplot for the chart.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

PASSES = ["fwd", "dlhs", "drhs"]
FAMILIES = ["v1", "v2", "hybrid", "auto"]
BASELINES = ["baseline-eigen", "baseline-openblas", "baseline-onednn", "baseline-naive-fp8"]
RECIPES = ["fp32", "bf16", "fp8", "fp8-block", "fp8-static"]
FP8_RECIPES = ["fp8", "fp8-block", "fp8-static"]


def load(path):
    """Returns (context, results, shapes, probes): results maps (pass, family, recipe, shape) and
    probes (kind, dtype, threads) to a benchmark's result dict, its median over repetitions when
    the run has them (the one repetition's result otherwise)."""
    with open(path) as f:
        data = json.load(f)
    runs, medians, shapes = {}, {}, []
    for b in data.get("benchmarks", []):
        aggregate = b.get("run_type", "iteration") == "aggregate"
        if aggregate and b.get("aggregate_name") != "median":
            continue
        parts = b["name"].split("/")
        if len(parts) < 4:
            continue
        key = tuple(parts[:4])
        (medians if aggregate else runs)[key] = b
        if key[0] != "probe" and key[3] not in shapes:
            shapes.append(key[3])
    runs.update(medians)
    results = {k: v for k, v in runs.items() if k[0] != "probe"}
    probes = {k[1:]: v for k, v in runs.items() if k[0] == "probe"}
    return data.get("context", {}), results, shapes, probes


def probe_table(context, probes):
    """The probes at the start of the run (best of a few passes) against their benchmarks
    interleaved with it (medians when repeated)."""
    kinds = [("fma", "fp32", "fp32", "GFLOP/s"), ("dot", "bf16", "bf16", "GFLOP/s"),
             ("amx", "bf16", "amx_bf16", "GFLOP/s"), ("read", "fp32", "read", "GB/s"),
             ("write", "fp32", "write", "GB/s")]
    head = ["probe", "1 thread: start", "in the run", "2 threads: start", "in the run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind, dtype, peak, unit in kinds:
        cells = ["%s %s (%s)" % (kind, dtype, unit)]
        found = False
        for t, threads in ((1, "1thread"), (2, "2threads")):
            start = context.get("peak_%s_%dt" % (peak, t), "")
            b = probes.get((kind, dtype, threads))
            value = None if b is None or b.get("error_occurred") else b.get(
                "GFLOP" if unit == "GFLOP/s" else "GB")
            found = found or value is not None
            cells += [start.split()[0] if start else "", fmt(value) if value else ""]
        if found:
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else None


def gflops(results, key):
    b = results.get(key)
    if b is None or b.get("error_occurred"):
        return None
    return b.get("GFLOP")


def row_baselines(results, p, recipe, shape):
    """(GFLOP/s, column label) of the baselines a row is compared with."""
    found = []
    for base in BASELINES:
        v = gflops(results, (p, base, recipe, shape))
        if v is not None:
            found.append((v, base))
    if recipe in FP8_RECIPES:
        v = gflops(results, (p, "baseline-onednn", "bf16", shape))
        if v is not None:
            found.append((v, "baseline-onednn (bf16)"))
    return found


def fmt(v):
    return "%.0f" % v if v >= 100 else "%.1f" % v if v >= 10 else "%.2f" % v


def table(results, shapes, p):
    families = [f for f in FAMILIES if any(k[1] == f and k[0] == p for k in results)]
    baselines = [b for b in BASELINES if any(k[1] == b and k[0] == p for k in results)]
    head = (["shape", "recipe"] + families + [b.replace("baseline-", "") for b in baselines] +
            ["best baseline"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape in shapes:
        for recipe in RECIPES:
            cells = [shape, recipe]
            base = row_baselines(results, p, recipe, shape)
            best = max(base)[0] if base else None
            any_value = False
            for f in families:
                key = (p, f, recipe, shape)
                v = gflops(results, key)
                if v is None:
                    cells.append("err" if key in results else "")
                    continue
                any_value = True
                cells.append(fmt(v) + (" (%.2fx)" % (v / best) if best else ""))
            for b in baselines:
                v = gflops(results, (p, b, recipe, shape))
                if v is not None:
                    any_value = True
                    cells.append(fmt(v))
                else:
                    cells.append("")
            cells.append("%s %s" % (max(base)[1].replace("baseline-", ""), fmt(best)) if base else "")
            if any_value or any((p, f, recipe, shape) in results for f in families):
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(results, shapes):
    """Per pass, the geometric mean over shapes (and fp8 recipes) of v1's and v2's GFLOP/s over
    the row's best baseline, for fp32, bf16 and the fp8 recipes."""
    groups = [("fp32", ["fp32"]), ("bf16", ["bf16"]), ("fp8 recipes", FP8_RECIPES)]
    head = ["pass"] + ["%s: v1 / v2" % name for name, _ in groups]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in PASSES:
        cells = [p]
        for _, recipes in groups:
            means = []
            for f in ["v1", "v2"]:
                logs = []
                for shape in shapes:
                    for recipe in recipes:
                        v = gflops(results, (p, f, recipe, shape))
                        base = row_baselines(results, p, recipe, shape)
                        if v is not None and base:
                            logs.append(math.log(v / max(base)[0]))
                means.append("%.2fx" % math.exp(sum(logs) / len(logs)) if logs else "-")
            cells.append(" / ".join(means))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scaling(results, shapes, threads):
    """v2 on the run's threads against its one-thread column (v2-1thread), where both ran."""
    head = ["pass", "recipe", "shape", "v2, 1 thread", "v2, %s threads" % threads, "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in PASSES:
        for recipe in RECIPES:
            for shape in shapes:
                one = gflops(results, (p, "v2-1thread", recipe, shape))
                many = gflops(results, (p, "v2", recipe, shape))
                if one and many:
                    lines.append("| %s | %s | %s | %s | %s | %.2fx |" %
                                 (p, recipe, shape, fmt(one), fmt(many), many / one))
    return "\n".join(lines) if len(lines) > 2 else None


def machine_scaling(probes):
    """The probes' 2-thread over 1-thread ratios (what a VM's second core gives during the run)."""
    found = []
    for kind, dtype, counter in (("fma", "fp32", "GFLOP"), ("read", "fp32", "GB"),
                                 ("write", "fp32", "GB")):
        one, two = (probes.get((kind, dtype, t)) for t in ("1thread", "2threads"))
        if one and two and one.get(counter) and two.get(counter):
            found.append("%s %s %.2fx" % (kind, dtype, two[counter] / one[counter]))
    return ", ".join(found)


def errors(results):
    seen = {}
    for key, b in results.items():
        if b.get("error_occurred"):
            seen.setdefault(b.get("error_message", "?"), []).append("/".join(key))
    return seen


def chart(results, shapes, context, path):
    """Clustered bars per pass: the best gmm family per recipe against the best baselines."""
    series = [
        ("gmm fp32", lambda p, s: best_family(results, p, "fp32", s)),
        ("gmm bf16", lambda p, s: best_family(results, p, "bf16", s)),
        ("gmm fp8", lambda p, s: best_family(results, p, "fp8", s)),
        ("gmm fp8-block", lambda p, s: best_family(results, p, "fp8-block", s)),
        ("best fp32 baseline",
         lambda p, s: max_or_none(gflops(results, (p, b, "fp32", s)) for b in BASELINES)),
        ("oneDNN bf16", lambda p, s: gflops(results, (p, "baseline-onednn", "bf16", s))),
        ("naive fp8", lambda p, s: gflops(results, (p, "baseline-naive-fp8", "fp8", s))),
    ]
    work = tempfile.mkdtemp(prefix="gmm_chart_")
    for p in PASSES:
        with open(os.path.join(work, p + ".dat"), "w") as f:
            f.write("shape " + " ".join('"%s"' % name for name, _ in series) + "\n")
            for s in shapes:
                vals = [fn(p, s) for _, fn in series]
                f.write(s + " " + " ".join("-" if v is None else "%.3f" % v for v in vals) + "\n")
    title = "gmm\\_bench, %s threads, %s" % (context.get("gmm_threads", "?"),
                                               context.get("date", "")[:10])
    plots = []
    for i, p in enumerate(PASSES):
        data = os.path.join(work, p + ".dat")
        cols = ", ".join("'%s' using %d:xtic(1) title columnheader" % (data, c + 2)
                         for c in range(len(series)))
        plots.append("%sset title '%s'\nplot %s" % ("unset key\n" if i else "", p, cols))
    script = "\n".join([
        "set terminal pngcairo size 1400,1500 font ',10'",
        "set output '%s'" % path,
        "set datafile missing '-'",
        "set style data histogram",
        "set style histogram cluster gap 1",
        "set style fill solid 0.9 border -1",
        "set logscale y",
        "set yrange [0.1:10000]",
        "set lmargin 10",
        "set rmargin 24",
        "set ylabel 'GFLOP/s (log)'",
        "set grid ytics",
        "set key outside right top",
        "set multiplot layout 3,1 title '%s'" % title,
    ] + plots + ["unset multiplot"])
    with open(os.path.join(work, "chart.gp"), "w") as f:
        f.write(script + "\n")
    subprocess.run(["gnuplot", os.path.join(work, "chart.gp")], check=True)


def best_family(results, p, recipe, shape):
    return max_or_none(gflops(results, (p, f, recipe, shape)) for f in ["v1", "v2"])


def max_or_none(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", help="Google Benchmark JSON output of gmm_bench")
    parser.add_argument("--run", help="path of gmm_bench: run it and summarize")
    parser.add_argument("--json-out", help="with --run: where to keep the JSON")
    parser.add_argument("--chart", help="write a PNG chart here (needs gnuplot)")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after "--": gmm_bench's own arguments
    args, extra = parser.parse_known_args(argv[:cut])
    extra += argv[cut + 1:]
    path = args.json
    if args.run:
        path = args.json_out or os.path.join(tempfile.mkdtemp(prefix="gmm_bench_"), "out.json")
        subprocess.run([args.run, "--benchmark_out=" + path, "--benchmark_out_format=json"] +
                       extra, check=True, stdout=sys.stderr)
    if not path:
        parser.error("give a JSON file or --run")
    context, results, shapes, probes = load(path)
    keys = ["date", "host_name", "num_cpus", "load_avg", "gmm_threads", "gmm_shapes",
            "gmm_compile_flags", "peak_fp32_1t", "peak_fp32_2t", "peak_bf16_1t", "peak_bf16_2t",
            "peak_amx_bf16_1t", "peak_amx_bf16_2t", "peak_read_1t", "peak_read_2t",
            "peak_write_1t", "peak_write_2t", "peak_fp32_isa", "peak_bf16_isa", "eigen",
            "openblas", "onednn"]
    keys += sorted(k for k in context if k.startswith("shape_"))
    for k in keys:
        if k in context:
            print("- %s: %s" % (k, context[k]))
    probed = probe_table(context, probes)
    if probed:
        print("\n### Probes: at the start of the run and interleaved with it\n")
        print(probed)
    print("\n### Geometric mean of v1 and v2 over the row's best baseline\n")
    print(summary(results, shapes))
    for p in PASSES:
        print("\n### %s: GFLOP/s (ratio to the row's best baseline)\n" % p)
        print(table(results, shapes, p))
    threads = context.get("gmm_threads", "?")
    scaled = scaling(results, shapes, threads)
    if scaled:
        print("\n### v2 on %s threads over v2 on 1 thread (GFLOP/s)\n" % threads)
        print(scaled)
        probe_scaling = machine_scaling(probes)
        if probe_scaling:
            print("\nThe machine's own scaling, 2 threads over 1 in the probes of the run: " +
                  probe_scaling + ".")
    errs = errors(results)
    if errs:
        print("\nSkipped with an error:")
        for msg, names in errs.items():
            print("- %d benchmarks: %s (e.g. %s)" % (len(names), msg, names[0]))
    if args.chart:
        chart(results, shapes, context, args.chart)
        print("\nchart: " + args.chart)


if __name__ == "__main__":
    main()
