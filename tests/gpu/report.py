"""Writes tests/gpu/run.sh's report (markdown, to stdout) from the files its phases left in LOGS:
machine.json, status.txt, phases.log, pytest.xml and pytest.log, bench.json (with the profiles'
summaries; their traces beside it as trace-*.json.gz). A program of ours that died of a fault
wrote its stack into a log (core/fatal_signals.h): the report lists each, its frames in our
programs named by addr2line where the machine has it.

    python tests/gpu/report.py LOGS > report.md
"""
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_summary import table  # noqa: E402


def read_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_results(path):
    """conftest.py's lines (one per finished test, or per failed setup or teardown), or None."""
    if not path.exists():
        return None
    results = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            results.append(json.loads(line))
        except ValueError:  # the last line cut short where pytest was killed writing it
            pass
    return results


HEADER = re.compile(r"(\S+): fatal signal (\S+)")
FRAME = re.compile(r"(?:^|\s)(?P<binary>[^\s(]+)\((?P<symbol>[^)]*)\)\s*\[0x[0-9a-f]+\]")


def crash_reports(logs: Path, most=4):
    """Markdown lines for each fatal-signal report (core/fatal_signals.h) in LOGS' *.log files
    (in pytest's output a subprocess's stderr may carry a prefix such as "E   "), its frames
    named where addr2line can: PROGRAM(+0xOFFSET) is an offset into that binary."""
    reports = []
    for log in sorted(logs.glob("*.log")):
        current = None
        for line in log.read_text(errors="replace").splitlines():
            header = HEADER.search(line)
            if header:
                current = {"log": log.name, "title": f"{header.group(1)}: {header.group(2)}",
                           "frames": []}
                reports.append(current)
                continue
            frame = FRAME.search(line) if current is not None else None
            if frame:
                current["frames"].append((frame.group("binary"), frame.group("symbol")))
            elif current is not None and current["frames"]:
                current = None  # the stack ended
    addr2line = shutil.which("addr2line")
    lines = []
    for report in reports[:most]:
        lines += ["", f"{report['title']} (in {report['log']}), innermost first:", ""]
        for binary, symbol in report["frames"]:
            name = symbol
            if addr2line and symbol.startswith("+0x") and Path(binary).exists():
                found = subprocess.run([addr2line, "-f", "-C", "-e", binary, symbol[1:]],
                                       capture_output=True, text=True).stdout.splitlines()
                if found and found[0] != "??":
                    name = found[0]
            lines.append(f"- `{Path(binary).name}` {name[:200]}")
    if len(reports) > most:
        lines += ["", f"({len(reports) - most} more in the logs)"]
    return lines


def main(logs: Path) -> int:
    lines = ["# Tessera GPU check", ""]
    machine = read_json(logs / "machine.json") or {}
    lines.append("Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    status = dict(line.split("=", 1) for line in (logs / "status.txt").read_text().split()
                  if "=" in line) if (logs / "status.txt").exists() else {}
    lines += ["", "Phases (exit codes): " + ", ".join(f"{k} {v}" for k, v in status.items())]
    if (logs / "phases.log").exists():
        lines += ["", "```", *(logs / "phases.log").read_text().splitlines(), "```"]
    version = read_json(logs / "version.json")
    if version:
        lines += ["", f"tessera-cli version: {json.dumps(version)}"]
    profile = read_json(logs / "profile.json")
    if profile:
        lines += [f"profile GPUs: {json.dumps(profile.get('gpus'))}"]

    counts = {"passed": 0, "failed": 0, "xfailed": 0, "skipped": 0}
    rows = []
    for log in sorted(logs.glob("pytest*.log")):
        xml = log.with_suffix(".xml")
        try:  # pytest stopped while writing its XML leaves it cut short: read the log instead
            cases = list(ET.parse(xml).getroot().iter("testcase")) if xml.exists() else None
        except ET.ParseError:
            cases = None
        results = read_results(log.with_suffix(".jsonl"))
        if cases is None and results is not None:
            # pytest was stopped before writing its XML: conftest.py's line per finished test.
            finished = set()
            for r in results:
                finished.add(r["nodeid"])
                outcome = ("xfailed" if r["xfail"] else r["outcome"]) if r["when"] == "call" \
                    else ("failed" if r["outcome"] == "failed" else r["outcome"])
                counts[outcome] = counts.get(outcome, 0) + 1
                why = (r["longrepr"].strip().splitlines() or [""])[-1]
                rows.append(f"| {r['nodeid'].split('::')[-1]} | {outcome} | {r['duration']} s | "
                            f"{why[:160]} (no XML: {log.name} stopped) |")
            collected = log.with_suffix(".jsonl.collected")
            never = [n for n in (collected.read_text().split() if collected.exists() else [])
                     if n not in finished]
            counts["not run"] = len(never)
            rows += [f"| {n.split('::')[-1]} | not run | | stopped before it finished |" for n in never]
        elif cases is not None:
            for case in cases:
                outcome, why = "passed", ""
                for child in case:
                    if child.tag in ("failure", "error"):
                        outcome = "failed"
                        why = ((child.get("message") or "").splitlines() or [""])[0]
                    elif child.tag == "skipped":
                        outcome = "xfailed" if "xfail" in child.get("type", "") else "skipped"
                        why = child.get("message") or ""
                counts[outcome] += 1
                rows.append(f"| {case.get('name')} | {outcome} | {case.get('time')} s | {why[:160]} |")
        else:
            # pytest was stopped before writing its XML: its -v lines say what had finished.
            for line in log.read_text(errors="replace").splitlines():
                # one process: "path::test OUTCOME"; pytest-xdist: "[gwN] [ n%] OUTCOME path::test"
                m = (re.search(r"::(?P<test>\S+) (?P<outcome>PASSED|FAILED|XFAIL|SKIPPED|ERROR)", line)
                     or re.search(r"(?P<outcome>PASSED|FAILED|XFAIL|SKIPPED|ERROR) \S*::(?P<test>\S+)",
                                  line))
                if m:
                    outcome = {"PASSED": "passed", "XFAIL": "xfailed",
                               "SKIPPED": "skipped"}.get(m.group("outcome"), "failed")
                    counts[outcome] += 1
                    rows.append(f"| {m.group('test')} | {outcome} | | (no XML: {log.name} stopped) |")
    if rows:
        lines += ["", "## Tests (tests/gpu/test_gpu.py)", "",
                  ", ".join(f"{v} {k}" for k, v in counts.items()), "",
                  "| test | result | time | note |", "|---|---|---|---|", *rows]
    failures = [r for log in sorted(logs.glob("pytest*.jsonl"))
                for r in (read_results(log) or []) if r["outcome"] == "failed"]
    if failures:
        lines += ["", "## Failures (the end of each)"]
        for r in failures[:12]:
            text = r["longrepr"].strip().splitlines()[-30:]
            lines += ["", f"{r['nodeid'].split('::')[-1]} ({r['when']}, {r['duration']} s):", "", "```",
                      *text, "```"]
        if len(failures) > 12:
            lines += ["", f"({len(failures) - 12} more in the logs)"]
    figures = []
    for log in sorted(logs.glob("pytest*.log")):
        figures += [l for l in log.read_text(errors="replace").splitlines()
                    if re.search(r"(cuda|rel |eval:|profile)", l)
                    and not l.startswith(("E ", ">", "tests/", "PASSED", "FAILED", "XFAIL"))
                    and "::" not in l]
    if figures:
        lines += ["", "Figures the tests printed:", "", "```", *figures[:160], "```"]

    crashes = crash_reports(logs)
    if crashes:
        lines += ["", "## Crashes (fatal signals)", *crashes]

    bench = read_json(logs / "bench.json")
    if bench:
        def failed(key, label):  # a part of the benchmark that failed, and why
            if f"{key}_error" in bench:
                lines.append(f"- {label} failed: {bench[key + '_error'][:300]}")

        def plan_line(key, label):  # bench_gpu.plan_against's figures of a strategy's run
            if f"{key}_plan" in bench:
                p = bench[f"{key}_plan"]
                lines.append(f"- {label}'s plan ÷ measured: step {p['step_ratio']:.2f} ({p['step_s'] * 1e3:.1f} ms "
                             f"planned, the CPU Adam {p['host_update_s'] * 1e3:.1f} ms of it; copies between "
                             f"host and GPU {p.get('copy_s', 0.0) * 1e3:.1f} ms, "
                             f"{p.get('exposed_copy_s', 0.0) * 1e3:.1f} ms of them not hidden)")
            failed(f"{key}_plan", f"{label}'s plan")

        lines += ["", "## Benchmark (tests/gpu/bench_gpu.py)", ""]
        g = bench.get("gemm_bf16_flops")
        if g and "copy" not in bench:  # bench_gpu.py --smoke: the CPU's rate only
            lines.append(f"- GEMM: bf16 {g / 1e9:.1f} GFLOP/s ({bench['gpu']})")
        elif g:
            lines.append(f"- GEMM: bf16 {g / 1e12:.0f} TFLOP/s, fp32 "
                         f"{bench['gemm_fp32_flops'] / 1e12:.1f} TFLOP/s; pinned copies h2d "
                         f"{bench['copy']['h2d'] / 1e9:.1f} GB/s, d2h {bench['copy']['d2h'] / 1e9:.1f} GB/s")
        if "params" in bench:
            lines.append(f"- model: {bench['params'] / 1e9:.2f}B parameters, batch "
                         f"{bench['batch']} × {bench['seq']} tokens, bf16")
        if "ours_step_s" in bench:
            lines.append(f"- ours: {bench['ours_step_s'] * 1e3:.1f} ms/step, MFU {bench['ours_mfu']:.3f}")
        failed("ours", "ours")
        if "trainer_step_s" in bench:
            lines.append(f"- HF Trainer loop: {bench['trainer_step_s'] * 1e3:.1f} ms/step, MFU "
                         f"{bench['trainer_mfu']:.3f}, peak {bench['trainer_peak_bytes'] / 2**30:.1f} GiB")
        failed("trainer", "the HF Trainer loop")
        if "plan" in bench:
            p = bench["plan"]
            lines.append(f"- the plan of the same job (`tessera-cli plan`) ÷ measured: step "
                         f"{p['step_ratio']:.2f} ({p['step_s'] * 1e3:.1f} ms planned), {p['tier']} "
                         f"peak {p['peak_ratio']:.2f} ({p['peak_bytes'] / 2**30:.2f} GiB planned, "
                         f"{bench['ours_peak_bytes'] / 2**30:.2f} GiB measured)")
        failed("plan", "plan")
        if "gemini_host_optim_ratio" in bench:
            lines.append(f"- gemini, optimizer in host memory: {bench['gemini_host_optim_step_s'] * 1e3:.1f} "
                         f"ms/step, ÷ ours on single {bench['gemini_host_optim_ratio']:.3f} (goal ≤ 1.10)")
        plan_line("gemini", "gemini")
        failed("gemini", "gemini")
        if "qlora_step_ratio" in bench:
            lines.append(f"- QLoRA (nf4, double-quantized) {bench['qlora_step_s'] * 1e3:.1f} ms/step ÷ LoRA on "
                         f"the bf16 base {bench['lora_step_s'] * 1e3:.1f} ms/step: {bench['qlora_step_ratio']:.3f}; "
                         f"peak {bench['lora_peak_bytes'] / 2**30:.2f} → {bench['qlora_peak_bytes'] / 2**30:.2f} GiB")
        failed("qlora", "QLoRA")
        if "zero_offload_ratio" in bench:
            lines.append(f"- ZeRO-Offload (stage 2) {bench['zero_offload_step_s'] * 1e3:.1f} ms/step ÷ ours on "
                         f"single {bench['zero_offload_ratio']:.3f}")
        plan_line("zero_offload", "ZeRO-Offload")
        failed("zero_offload", "ZeRO-Offload")
        if "loss_max_rel" in bench:
            lines.append(f"- losses ours vs Trainer: at most {bench['loss_max_rel']:.2e} relative apart")
        if "speedup_vs_trainer" in bench:
            lines.append(f"- ours ÷ Trainer step time {1 / bench['speedup_vs_trainer']:.3f} "
                         f"(goal: speed-up ≥ 1.1×, MFU ≥ 0.55)")
        if bench.get("profile"):
            sides = bench["profile"]
            first = next(iter(sides.values()))
            lines += ["", f"Where a step goes ({first['steps']} profiled steps after the timed "
                      f"ones, {first['source']}; trace_summary.py):", "", *table(sides)]
            for side, summary in sides.items():
                lines += ["", f"{side}'s largest:", ""]
                lines += [f"- {row['ms_per_step']:.2f} ms, {row['calls_per_step']:.0f}× "
                          f"`{row['name']}`" for row in summary["top"][:8]]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
