"""docs/hints.md, written from the rules themselves (scripts/gen_hints_doc.py)."""

from __future__ import annotations

from .catalogue import RULES


def rules_markdown() -> str:
    """docs/hints.md: every rule with its id, thresholds, needs and why (scripts/gen_hints_doc.py)."""
    lines = [
        "# Tuning hints",
        "",
        "<!-- Generated from slurm_gpu_eff/report/hints/ by scripts/gen_hints_doc.py: do not edit. -->",
        "",
        "Every `gpueff` report ends with hints: a finding in one sentence, the measured figures",
        "behind it (`evidence`), the `#SBATCH` line or code change to make (`fix`) and the",
        "GPU-hours it saves on this job (`savings`: `gpu_hours`, `kind` and `how`; also",
        "`savings_gpu_hours`). Only GPU-hours measured idle (idle GPUs, idle stretches, an idle",
        "session) are `measured` and read \"would have saved\"; every other figure is `estimated`,",
        "reads \"up to\" and says how it was worked out.",
        "",
        "SM activity (GPM, Hopper and newer) is the main under-use signal: NVIDIA's DCGM reads under",
        "50% as likely ineffective use at any utilisation, while NVML's utilisation counts any kernel",
        "however small. Where SM activity is not measured, the hints say they rest on utilisation",
        "alone. A rule never speaks from a metric that was not measured: a GPU on which a metric",
        "the rule needs was not measured (MIG slices have no utilisation; GPUs before Hopper have",
        "no GPM, so no SM activity, pipes, DRAM or PCIe figures) is left out of that rule.",
        "",
        "Fixes are fitted to the job: a framework's fix (PyTorch, TensorFlow, JAX) goes only to a",
        "job whose GPU processes use it; any other job gets a framework-neutral fix and Nsight",
        "Systems (`nsys profile`) to find what the GPU waits on. A run that failed or was cancelled",
        "in its first 5 minutes gets only `too_early`; one that ran longer is judged by every rule.",
        "Hardware problems go to the admins and are left out of the user's verdict.",
        "",
        "Each rule's text names the source of its thresholds, or says \"ours\" where they are this",
        "project's own choice.",
        "",
        "## Site settings",
        "",
        "In the `[hints]` section of the config file. Thresholds are numbers; a message replaces",
        "the rule's wording and may name the hint's evidence figures (and `savings_gpu_hours`) in",
        "braces, optionally with a format such as `:.0f`; anything else in braces is printed as",
        "written, never evaluated. Links must be http(s) addresses.",
        "",
        "```toml",
        "[hints]",
        'disable = ["short_job", "time_limit"]',
        "low_util.warn_pct = 30",
        'low_util.message = "Your GPUs were busy only {util_mean_pct:.0f}% of the time."',
        'low_util.link = "https://hpc.example.org/docs/gpu-efficiency"',
        "```",
        "",
        "| id | title | audience | needs |",
        "|---|---|---|---|",
    ]
    for rule in RULES:
        needs = ", ".join(f"`{n}`" for n in rule.needs) or "-"
        lines.append(f"| [`{rule.id}`](#{rule.id}) | {rule.title} | {rule.audience} | {needs} |")
    for rule in RULES:
        lines += ["", f"## {rule.id}", "", f"**{rule.title}** (audience: {rule.audience}; needs: "
                  + (", ".join(f"`{n}`" for n in rule.needs) or "no particular metric") + ")",
                  "", rule.why, "", "| setting | default |", "|---|---|"]
        lines += [f"| `{rule.id}.{name}` | {value:g} |" for name, value in rule.params.items()]
        if rule.evidence:
            keys = ", ".join(f"`{k}`" for k in rule.evidence)
            lines += ["", f"Evidence (message placeholders): {keys}."]
    return "\n".join(lines) + "\n"
