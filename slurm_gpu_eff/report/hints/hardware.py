"""Hardware problems, for the admins."""

from __future__ import annotations

from ..shapes import Hint, JobReport
from .core import Rule, hint, label, pct

# XIDs that the job's own code usually causes (NVIDIA's XID catalogue): an illegal memory
# access, an MMU fault, a stopped or cleaned-up channel.
APP_XIDS = frozenset({13, 31, 43, 45})
_SLOWDOWNS = {"hw_slowdown": "hardware slowdown", "sw_thermal": "software thermal slowdown",
              "hw_thermal": "hardware thermal slowdown", "power_brake": "power brake"}


def _hardware(report: JobReport, p: dict[str, float]) -> list[Hint]:
    hints = []
    for g in report.gpus:
        s = g.summary
        if s is None:
            continue
        problems, severity = [], "warning"
        throttle = {}
        if s.throttle_s and s.throttle_observed_s:
            for reason, name in _SLOWDOWNS.items():
                share = s.throttle_s.get(reason, 0.0) / s.throttle_observed_s
                if share > p["throttle_fraction"]:
                    throttle[reason] = pct(100 * share)
                    problems.append(f"{name} {100 * share:.0f}% of the time")
        xids = [int(e["xid"]) for e in s.xid_events if isinstance(e.get("xid"), (int, float))]
        hardware_xids = [x for x in xids if x not in APP_XIDS]
        if xids:
            problems.append("XID " + ", ".join(str(x) for x in sorted(set(xids))))
        if s.ecc_uncorrected:
            problems.append(f"{s.ecc_uncorrected} uncorrected ECC error(s)")
        if s.lost_at is not None:
            problems.append("fell off the bus")
        if not problems:
            continue
        if hardware_xids or s.ecc_uncorrected or s.lost_at is not None:
            severity = "critical"
        evidence = {"node": g.node, "minor": g.minor, "uuid": g.uuid, "throttle_pct": throttle,
                    "xids": xids, "ecc_uncorrected": s.ecc_uncorrected or 0, "lost_at": s.lost_at,
                    "faults": g.hardware_faults}
        if throttle or hardware_xids or s.ecc_uncorrected or s.lost_at is not None:
            message = (f"Node problem for the admins, not your job's fault: {label(g)} had "
                       f"{'; '.join(problems)}.")
        else:
            message = (f"{label(g)} reported {problems[0]}: these XIDs usually come from the job's own code "
                       f"(an invalid memory access), and are a node problem only if other jobs on {g.node} "
                       "see them too.")
        fix = (f"Admins: check {label(g)} (nvidia-smi -q -d PERFORMANCE,ECC,TEMPERATURE; "
               f"dmesg | grep -i xid) and drain {g.node} if it recurs. Users: resubmit; "
               f"'#SBATCH --exclude={g.node}' avoids the node meanwhile")
        hints.append(hint("hardware", severity, message, evidence, fix, None, audience="admin"))
    return hints


RULES: tuple[Rule, ...] = (
    Rule(
        "hardware", "Hardware problems (for the admins)",
        "Clock slowdowns for hardware or thermal reasons or a power brake over 5% of the time "
        "(ours), XID "
        "errors, uncorrected ECC errors and a GPU lost from the bus are the node's problem, not the "
        "user's: they go to the admins, are left out of the user's verdict, and a lost GPU is left "
        "out of the idle and utilisation rules. Power-cap slowdown is normal under load and is not "
        "flagged. XIDs 13, 31, 43 and 45 usually come from the job's own code (NVIDIA's "
        "k8s-device-plugin counts them as application errors), so they alone are a warning.",
        {"throttle_fraction": 0.05}, (), _hardware, audience="admin",
        evidence=("node", "minor", "uuid", "throttle_pct", "xids", "ecc_uncorrected", "lost_at", "faults"),
    ),
)
