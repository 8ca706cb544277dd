"""`gpueff`: the command line. Parse, call one library function, render; only this prints.

Every error the package raises on purpose becomes one line on stderr and its own exit
status (see model.py); anything else is a bug, reported as such without a traceback
unless --debug is given.
"""

from __future__ import annotations

import gc
import os
import sys

from .config import load_config
from .errors import GpuEffError, NotPermitted

# typing.TYPE_CHECKING, without importing typing before sacct starts (mypy takes any
# TYPE_CHECKING for it)
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import Any

    from .slurm.sacct import EarlyRun, SacctRun

INTERNAL_ERROR = 70


def report_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpueff",
        description="GPU efficiency of a Slurm job: seff's figures plus what its GPUs did.",
        epilog="Also: 'gpueff report' shows GPU usage over a period (admins; --me: your own); "
               "'gpueff spool status' says what waits in a node's spool and why; "
               "'gpueff spool flush' delivers it to the store now; 'gpueff config' prints the "
               "configuration in force; 'gpueff doctor' says whether this host is ready. "
               "Each has its own --help.",
    )
    parser.add_argument("job_id", metavar="JOBID", help="job id, e.g. 1234 or 1234_7")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _common(parser)
    return parser


def spool_parser(prog: str = "gpueff spool") -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="A node's spool: what waits for the store and why (status), or deliver "
                    "it now (flush, as root). 'gpueff deliver' is 'gpueff spool flush'.",
    )
    if prog == "gpueff spool":
        parser.add_argument("action", choices=("status", "flush"))
    parser.add_argument("--node", default=os.uname().nodename.split(".")[0],
                        help="node whose spool to deliver (default: this host)")
    _common(parser)
    return parser


def usage_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpueff report",
        description="GPU usage over a period: GPU-hours allocated, used and wasted, coverage, "
                    "energy, cost and hints, by group (admins: it reads the store). --me: your "
                    "own jobs, through Slurm's accounting (any user).",
    )
    parser.add_argument("--since", default="now-7days", help="start (as sacct -S: 2026-11-01, "
                        "2026-11-01T08:00:00, now-7days; default now-7days)")
    parser.add_argument("--until", default="now", help="end (as sacct -E; default now)")
    parser.add_argument("--by", action="append", default=[], metavar="KEY[,KEY]",
                        help="group by user, account, partition, node, gpu-model, day, week or "
                             "month; several at once (default user)")
    for name in ("user", "account", "partition"):
        parser.add_argument(f"--{name}", action="append", default=[], metavar=name.upper(),
                            help=f"only this {name} (several: repeat or comma-separate)")
    parser.add_argument("--min-gpu-hours", type=float, default=0.0, metavar="H",
                        help="leave out groups with fewer allocated GPU-hours")
    parser.add_argument("--top", type=int, default=None, metavar="N",
                        help="the N most wasteful jobs with their main hint (html: 10)")
    parser.add_argument("--trend", action="store_true",
                        help="per user: efficiency per week, before / after each first warning")
    parser.add_argument("--me", action="store_true", help="your own jobs only, whatever else is asked")
    parser.add_argument("--format", choices=("text", "csv", "json", "html"), default="text")
    parser.add_argument("--no-sync", action="store_true",
                        help="use the accounting already in the store (no sacct call)")
    _common(parser)
    return parser


def config_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpueff config",
        description="The configuration in force: every setting of the file, defaults filled in "
                    "(TOML; a file that is wrong is named with the key and line at fault).",
    )
    parser.add_argument("--json", action="store_true", help="as one JSON object")
    _common(parser)
    return parser


def cmd_config(args: argparse.Namespace) -> str:
    from .config import config_path, effective
    from .report.render import render_config

    config = load_config(args.config)
    return render_config(effective(config), config.path or f"{config_path(args.config)} (absent: defaults)",
                         as_json=args.json)


NOT_READY = 11  # gpueff doctor: a check failed


def doctor_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpueff doctor",
        description="Is this host ready? Checks the config, Slurm's Prolog, Epilog, MailProg and "
                    "PrologFlags, and on a GPU node NVML, gres.conf's devices and the spool, then "
                    f"the store and Slurm's accounting; each failure with its fix. Then notes: the "
                    "Slurm release, the cgroup version in use, and settings that change what is "
                    f"measured (warnings do not fail). Exit status 0 when ready, {NOT_READY} when not.",
    )
    parser.add_argument("--node", default="", help="the Slurm node name to check as (default: "
                        "$SLURMD_NODENAME, else this host's short name)")
    parser.add_argument("--json", action="store_true",
                        help='{"ready": true|false, "checks": [{"name", "ok", "message", "fix"}], '
                             '"notes": [{"name", "level": "info"|"warning", "message", "fix"}]}')
    _common(parser)
    return parser


def cmd_doctor(args: argparse.Namespace) -> tuple[str, int]:
    from .doctor import as_dict, examine
    from .report.render import render_doctor

    ready, checks, notes = examine(args.config, args.node)
    return render_doctor(as_dict(ready, checks, notes), as_json=args.json), 0 if ready else NOT_READY


def plain_report(argv: list[str]) -> argparse.Namespace | None:
    """`gpueff JOBID [--json] [--config FILE] [--debug]`, the everyday call, read without
    argparse (~5 ms to load before the report can go on): the Namespace report_parser()
    would give. Anything else (--help, an abbreviation, a typo, a second JOBID) is left to
    argparse, which says what is wrong."""
    if not argv or argv[0].startswith("-"):
        return None
    values: dict[str, Any] = {"job_id": argv[0], "json": False, "config": None, "debug": False}
    rest = iter(argv[1:])
    for arg in rest:
        if arg in ("--json", "--debug"):
            values[arg[2:]] = True
        elif arg == "--config":
            value = next(rest, None)
            if value is None or value.startswith("-"):
                return None
            values["config"] = value
        elif arg.startswith("--config="):
            values["config"] = arg.partition("=")[2]
        else:
            return None
    from types import SimpleNamespace

    return SimpleNamespace(**values)  # type: ignore[return-value]  # read as argparse's


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="config file (default: $GPUEFF_CONFIG or /etc/slurm-gpu-eff/gpueff.toml)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")


def cmd_report(args: argparse.Namespace, early: SacctRun | None = None, alone: bool = False) -> str:
    """`gpueff JOBID`. `alone`: in a process of its own (main() from the command line), whose
    cyclic garbage collector main() has held off while it loads."""
    from .slurm.access import connect

    config = load_config(args.config)
    slurm = connect(config, early, use="report")
    from functools import partial

    from .report.hints import HintSettings
    from .report.lookup import job_report
    from .report.render import prepare, render_json, render_text
    from .store import prepare as prepare_store

    # Whatever does not depend on the job, made ready before sacct is waited for: after
    # its answer only the job's own work is left.
    prepare(args.json)
    prepare_store(config.store_read_url)
    if alone:
        # What is loaded stays for the process's life: the collector need not go through
        # it again (a full pass over it cost ~10 ms after sacct's answer), only the job's.
        gc.freeze()
        gc.enable()
    report = job_report(slurm, args.job_id, partial(_read_store, config.store_read_url),
                        HintSettings.from_config(config.hints))
    return render_json(report) if args.json else render_text(report)


def cmd_usage(args: argparse.Namespace) -> str:
    import time

    from .report.usage import Period, UsageQuery

    config = load_config(args.config)
    now = time.time()
    period = Period.parse(args.since, args.until, now)
    if args.me:
        return _mine(config, period, args.format)
    query = UsageQuery(
        period, by=tuple(_listed(args.by) or ["user"]), users=tuple(_listed(args.user)),
        accounts=tuple(_listed(args.account)), partitions=tuple(_listed(args.partition)),
        min_gpu_hours=args.min_gpu_hours, trend=args.trend, charts=args.format == "html",
        top=args.top if args.top is not None else (10 if args.format == "html" else 0),
        price_per_kwh=config.price_per_kwh, currency=config.currency, co2_g_per_kwh=config.co2_g_per_kwh,
    )
    from .report.render import render_usage

    return render_usage(_usage(config, query, now, sync=not args.no_sync), args.format)


def _usage(config: Any, query: Any, now: float, sync: bool) -> dict[str, Any]:
    from functools import partial

    from .report.hints import HintSettings
    from .report.lookup import nodes_of
    from .report.usage import cluster_median, gpu_jobs, sacct_time, usage_report
    from .report.usage import sync as sync_usage
    from .slurm.access import connect
    from .store import open_store
    from .store.usage import last_sync

    if not _admin(config.store_admin_group):
        raise NotPermitted("gpueff report reads the store, which is the admins' (root and the "
                           "[store] admin_group): 'gpueff report --me' shows your own jobs")
    writer = os.geteuid() == 0 and sync
    store = (open_store(config.store_url, admin_group=config.store_admin_group) if writer
             else open_store(config.store_read_url, readonly=True))
    notes = []
    with store:
        period = query.period
        if writer:
            _progress(f"asking Slurm's accounting for jobs from {sacct_time(period.since)} "
                      f"to {sacct_time(period.until)}...")
            slurm = connect(config, use="period")
            jobs = slurm.period_jobs(period.since, period.until)
            done = sync_usage(store, jobs, period, partial(_read_store, config.store_read_url),
                              HintSettings.from_config(config.hints), now,
                              lambda n, total: _progress(f"figures of {n} of {total} runs updated"),
                              node_shares=slurm.node_shares(nodes_of(gpu_jobs(jobs))))
            _progress("")
            notes += done.notes
            _publish(config.median_file, cluster_median(store, period))
        else:
            last = last_sync(store)
            notes.append("the accounting in the store is as root's last `gpueff report` left it: "
                         + (f"{sacct_time(last['at'])}, for {sacct_time(last['since'])} to "
                            f"{sacct_time(last['until'])}" if last else "never"))
        data = usage_report(store, query)
    data["notes"] = notes
    return data


def _admin(group: str) -> bool:
    """Root, or a member of the admin group (those the store lets read: docs/security.md)."""
    if os.geteuid() == 0:
        return True
    import grp

    try:
        gid = grp.getgrnam(group).gr_gid if group else None
    except KeyError:
        return False
    return gid is not None and (gid in os.getgroups() or gid == os.getegid())


def _mine(config: Any, period: Any, form: str) -> str:
    import json
    import pwd
    from functools import partial

    from .report.hints import HintSettings
    from .report.render import render_mine
    from .report.usage import my_report
    from .slurm.access import connect

    if form == "html":
        raise GpuEffError("--me comes as text, csv or json")
    user = pwd.getpwuid(os.getuid()).pw_name
    _progress("asking Slurm's accounting for your jobs...")
    jobs = connect(config, use="period").period_jobs(period.since, period.until, user=user)
    _progress("")
    jobs = [j for j in jobs if j.user == user]  # Slurm's answer, held to the question
    try:
        with open(config.median_file, encoding="utf-8") as published:
            median = json.load(published)
    except (OSError, ValueError):
        median = None
    data = my_report(jobs, period, partial(_read_store, config.store_read_url),
                     HintSettings.from_config(config.hints), median if isinstance(median, dict) else None)
    return render_mine(data, form)


def _publish(path: str, median: dict[str, Any]) -> None:
    """The cluster's median for users' --me: written whole or not at all, readable by all."""
    import contextlib
    import json

    part = f"{path}.{os.getpid()}.part"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(part, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)
            json.dump(median, out)
        os.replace(part, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)


def _listed(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _progress(text: str) -> None:
    """Long work says where it is on a terminal, and nothing when stderr is piped."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\x1b[K{text}" if text else "\r\x1b[K")
        sys.stderr.flush()


def _read_store(url: str) -> Any:
    from .store import open_store

    return open_store(url, readonly=True)


def cmd_spool(args: argparse.Namespace) -> str:
    from .node.spool import Spool
    from .store import open_store
    from .store.deliver import Busy, flush, spool_status

    config = load_config(args.config)
    spool = Spool(config.spool_for(args.node))
    if getattr(args, "action", "flush") == "status":
        return _status_text(spool_status(spool), spool.outbox)
    try:
        result = flush(spool, lambda: open_store(config.store_url, admin_group=config.store_admin_group))
    except Busy as exc:
        raise GpuEffError(f"{exc}: it delivers what waits; see 'gpueff spool status'") from exc
    except OSError as exc:  # not root, or no spool for this node here
        raise GpuEffError(f"cannot deliver from {spool.root}: {exc.strerror or exc} "
                          "(run it as root on the node, or name the node with --node)") from exc
    lines = [f"delivered {result.delivered}, skipped {result.skipped} older than stored"]
    lines += [f"rejected by the store, kept with the reason: {p}" for p in result.dead]
    lines += [f"not a summary, set aside: {p}" for p in result.set_aside]
    return "\n".join(lines) + "\n"


def _status_text(status: Any, outbox: str) -> str:
    lines = [f"{outbox}: {len(status.pending)} waiting, {len(status.inflight)} in flight, "
             f"{len(status.dead)} rejected, {len(status.corrupt)} not summaries"]
    if status.deliverer:
        lines.append(f"a delivery is running (pid {status.deliverer})")
    if status.retrier:
        lines.append(f"the store was unreachable: pid {status.retrier} retries it until it is back")
    elif status.pending or status.inflight:
        lines.append("no delivery is running: 'gpueff spool flush' delivers them now")
    if status.dropped:
        lines.append("dropped while the store was away (the spool's max_mb): "
                     f"{status.dropped.get('live', 0)} live copies, "
                     f"{status.dropped.get('emptied', 0)} final summaries kept without their figures, "
                     f"{status.dropped.get('dropped', 0)} whole")
    lines += [f"waiting: {p}" for p in status.pending + status.inflight]
    lines += [f"rejected: {p}: {why}" for p, why in status.dead]
    lines += [f"not a summary: {p}" for p in status.corrupt]
    return "\n".join(lines) + "\n"


def early_sacct(argv: list[str], handed: str | None = None) -> SacctRun | None:
    """The report's sacct, started before anything else loads (argparse included): slurmdbd
    answers while gpueff starts. `handed`: the one bin/gpueff started before the
    interpreter ($GPUEFF_EARLY_SACCT), taken if it is that same command. None when argv is
    not a plain report, or anything is amiss: the normal path then says what."""
    from .slurm.sacct import SacctRun

    named = _report_sacct(argv)
    if named is None:
        if handed is not None:
            SacctRun.drop(handed)
        return None
    try:
        run = SacctRun(argv[0], *named, handed=handed)
    except GpuEffError:
        return None
    run.nodes = _early_nodes()
    return run


def _early_nodes() -> EarlyRun | None:
    """Every node's configuration (`scontrol show node -o`), asked beside the report's
    sacct: the hints weigh the job against its nodes' share, and which nodes those are
    only sacct's answer says; slurmctld's answer (~7 ms) would come after it. One request
    for all, as each sinfo makes; its answer waits in its pipe until read."""
    from .config import find_command
    from .slurm.sacct import EarlyRun

    try:
        return EarlyRun([find_command("scontrol"), "show", "node", "-o"], "slurmctld")
    except GpuEffError:
        return None


def _report_sacct(argv: list[str]) -> tuple[str, str] | None:
    """The report's sacct and comment field where argv asks for a report that sacct
    answers; None otherwise (pyslurm's, not a report, a config load_config() refuses)."""
    if not argv or argv[0] in ("spool", "deliver", "report", "config", "doctor") or argv[0].startswith("-"):
        return None
    config = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    config = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), config)
    try:
        from .config import sacct_settings

        named = sacct_settings(config)
        if named is None:
            loaded = load_config(config)
            if loaded.slurm_backend == "pyslurm":  # asked in-process instead (auto: sacct, slurm/access.py)
                return None
            named = loaded.sacct, loaded.comment_field
        return named
    except GpuEffError:
        return None


def main(argv: list[str] | None = None) -> int:
    own = argv is None  # the gpueff command, a process of its own: not a caller's function call
    if own:
        gc.disable()  # while it loads (cmd_report enables it again, other commands below)
    argv = sys.argv[1:] if argv is None else argv
    # bin/gpueff's sacct, if it started one: ours to take or stop, and no child's to see
    handed = os.environ.pop("GPUEFF_EARLY_SACCT", None) if own else None
    early = early_sacct(argv, handed)
    from functools import partial  # here: nothing but the standard library's least before sacct

    command: Callable[[argparse.Namespace], str | tuple[str, int]]
    args: argparse.Namespace | None = None
    job = False  # `gpueff JOBID`, the report of one job
    if argv[:1] == ["deliver"]:
        parser, command, argv = spool_parser("gpueff deliver"), cmd_spool, argv[1:]
    elif argv[:1] == ["report"]:
        parser, command, argv = usage_parser(), cmd_usage, argv[1:]
    elif argv[:1] == ["spool"]:
        parser, command, argv = spool_parser(), cmd_spool, argv[1:]
    elif argv[:1] == ["config"]:
        parser, command, argv = config_parser(), cmd_config, argv[1:]
    elif argv[:1] == ["doctor"]:
        parser, command, argv = doctor_parser(), cmd_doctor, argv[1:]
    else:
        command, job = partial(cmd_report, early=early, alone=own), True
        args = plain_report(argv)
        if args is None:
            parser = report_parser()
    if own and not job:
        gc.enable()
    if args is None:
        args = parser.parse_args(argv)
    status = _run(command, args)
    if own and job:
        _leave(status)
    return status


def _run(command: Callable[[argparse.Namespace], str | tuple[str, int]], args: argparse.Namespace) -> int:
    try:
        out = command(args)
        text, status = out if isinstance(out, tuple) else (out, 0)
        sys.stdout.write(text)
        return status
    except GpuEffError as exc:
        print(f"gpueff: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"gpueff: internal error ({type(exc).__name__}: {exc}); rerun with --debug "
              "and report it", file=sys.stderr)
        return INTERNAL_ERROR


def _leave(status: int) -> None:
    """`gpueff JOBID` ends here, its report written: without the interpreter's teardown,
    which frees every object jinja2 and the rest loaded one by one (~10 ms, more than the
    report's own work after sacct). Nothing is left to it: no thread, no atexit handler,
    the store closed, sacct's answer read. Where a flush fails (a reader gone from the
    pipe, a full disk), the interpreter's own exit says so, as it always did (status 120)."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:
        return
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
