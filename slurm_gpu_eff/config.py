"""Site configuration: one TOML file (standard library only: the hooks read it).

The file is found through $GPUEFF_CONFIG, else /etc/slurm-gpu-eff/gpueff.toml; a
missing file means defaults (the driver's NVML, spool and store under /var). Paths may hold
`%n`, replaced by the Slurm node name, so nodes that share a host or a filesystem
keep apart.
"""

from __future__ import annotations

import math
import os
import sys
import time

from .errors import ConfigError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without loading typing (or collections) for it
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DEFAULT_PATH = "/etc/slurm-gpu-eff/gpueff.toml"


class Config:
    """Settings, with the defaults a production node gets when the file says nothing: each
    one a class attribute below, which Config(name=value) overrides for its instance (the
    file's keys map to these names in _KEYS).

    A plain class, not a dataclass: `gpueff JOBID` imports this, and a dataclass of 70
    fields costs its start-up a millisecond and more to build.
    """

    path: str | None  # the file read, None where there was none
    hints: dict[str, str]  # [hints] as written: the hints module knows its rules and checks them

    # The libnvidia-ml.so.1 pynvml uses: "" for the driver's (found by the loader), or
    # a path (a driver outside the loader's path; the stand-in library in tests).
    gpu_library: str = ""
    # The driver's MIG capability table: Slurm names a MIG slice by its capability file.
    mig_minors: str = "/proc/driver/nvidia-caps/mig-minors"
    # The node's GPU map: `slurmd -G`'s answer, kept by root (the sampler) so that no job
    # asks slurmd again (on 24.11+ each ask disturbs every running job of the node).
    gpu_map_file: str = "/var/lib/slurm-gpu-eff/gpu-map-%n.json"
    sim_devices: str = ""
    sim_state_dir: str = ""
    sim_time_scale: float = 1.0  # simulated seconds per wall-clock second
    # Tests only: a file holding seconds the node's samplers add to their wall clock (a
    # clock step seen by a sampler, the machine's own clock untouched; %n: the node).
    sim_clock_offset_file: str = ""
    interval_s: float = 1.0
    checkpoint_s: float = 60.0
    # How often a running job's figures reach the store: a copy is at most this old
    # plus its delivery (under 60 s in all), the first one 10 s into the job.
    live_s: float = 45.0
    spool_dir: str = "/var/spool/slurm-gpu-eff/%n"
    # An unreachable store: the node's retrier tries again after retry_s, doubling the
    # wait up to retry_max_s, for retry_for_s (no new job on the node needed).
    retry_s: float = 30.0
    retry_max_s: float = 600.0
    retry_for_s: float = 86400.0
    # The most a node's outbox holds while the store is away (see store/deliver.py).
    spool_max_mb: float = 512.0
    store_path: str = "/var/lib/slurm-gpu-eff/gpueff.db"
    # The store's engine and place: postgresql://... for PostgreSQL; empty for the
    # SQLite file at store_path (sqlite:///ABSOLUTE/PATH says the same).
    store_url: str = ""
    # Where `gpueff` reads when it is not the writers' URL (a read-only role); empty:
    # store_url.
    store_read_url: str = ""
    # Who may read the SQLite file besides root (0640 root:this group); "": root only.
    store_admin_group: str = ""
    log_file: str = "/var/log/slurm-gpu-eff/%n.log"
    hook_timeout_s: float = 10.0  # hard bound for a prolog or epilog
    stop_wait_s: float = 3.0  # how long the epilog waits for the sampler to flush
    python: str = sys.executable  # interpreter for the processes the hooks start
    sacct: str = "sacct"
    slurmd: str = "slurmd"  # `slurmd -G` maps Slurm's GPU indexes to device files
    squeue: str = "squeue"  # a sampler whose epilog never came asks whether its job ended
    # Each job's GPU figures in its AdminComment in Slurm's accounting (mirror.py):
    # how users read them, under Slurm's own rules (docs/security.md).
    admin_comment: bool = True
    # Which field holds them: "AdminComment", or "SystemComment" where a site's own tool
    # needs the AdminComment to itself (jobstats: docs/install.md).
    comment_field: str = "AdminComment"
    slurm_backend: str = "auto"  # how gpueff asks Slurm: slurm/access.py
    # How often a running job's figures are mirrored there (0: only at its end).
    live_mirror_s: float = 300.0
    scontrol: str = "scontrol"
    sacctmgr: str = "sacctmgr"
    scancel: str = "scancel"  # idle-GPU alerts' cancelling (mail/idle.py)
    # node_exporter's textfile collector directory: each running job's live figures
    # there (node/export.py); "": no export.
    export_dir: str = ""
    # Its labels: "job" (job_id, node, minor, uuid) or "user" (adds user and account,
    # for everyone who reads the file or node_exporter's port: docs/security.md).
    export_labels: str = "job"
    # Usage reports: the price of a kWh (in `currency`) and the grid's carbon intensity
    # (g CO2 per kWh) turn GPU energy into cost and CO2; None: those columns stay empty.
    price_per_kwh: float | None = None
    currency: str = ""
    co2_g_per_kwh: float | None = None
    # Where root's `gpueff report` publishes the cluster's median efficiency (an
    # aggregate, world-readable) that `gpueff report --me` sets a user's own against.
    median_file: str = "/var/lib/slurm-gpu-eff/cluster-median.json"
    # The job-end mail (gpueff-mail, Slurm's MailProg: mail/). Off: Slurm's plain
    # notifications only, still sent by gpueff-mail.
    mail_enabled: bool = True
    mail_transport: str = "smtp"  # or "sendmail": the local program below
    mail_smtp_host: str = "localhost"
    mail_smtp_port: int = 25
    mail_smtp_security: str = "none"  # "starttls" or "tls" (SMTPS)
    mail_smtp_user: str = ""  # a login, with its password in the file below
    mail_smtp_password_file: str = ""
    mail_sendmail: str = "/usr/sbin/sendmail"
    mail_from: str = ""  # "": slurm@ this host's name
    # Messages wait here until delivered (the SMTP server away), retried after retry_s,
    # doubling to retry_max_s, for retry_for_s; then given up, and logged. SlurmUser's
    # (the MailProg and the idle watch run as it), so not under the node spool's root,
    # which root's hooks make 0700 (with every parent they make) on a controller that
    # is also a GPU node: a root of its own, beside it.
    mail_spool_dir: str = "/var/spool/slurm-gpu-eff-mail"
    mail_retry_s: float = 60.0
    mail_retry_max_s: float = 1800.0
    mail_retry_for_s: float = 172800.0
    # How long the report waits for the job's summary and accounting after Slurm's
    # end-of-job mail; then the plain notification goes out, saying why.
    mail_wait_s: float = 300.0
    # How many workers make and send messages at once; the rest wait in the spool.
    mail_workers: int = 8
    # The report only for jobs of at least this long and this many GPUs.
    mail_min_minutes: float = 0.0
    mail_min_gpus: int = 1
    mail_footer: str = ""  # e.g. where the site's help is
    mail_opt_out_file: str = ""  # user names, one a line: Slurm's plain mail for them
    # SlurmUser's too, so beside the hooks' log directory (root's, 0700), not in it.
    mail_log_file: str = "/var/log/slurm-gpu-eff-mail/mail.log"
    # A bare user name as recipient (no --mail-user) gets "@" this, as Slurm's
    # MailDomain does; "": sent to the bare name (the mail server's local user).
    mail_domain: str = ""
    # Idle-GPU alerts on running jobs (mail/idle.py), off at 0: the user is mailed once
    # a GPU of the job has been under 5% for idle_alert_min minutes; with
    # idle_cancel_min, the job is cancelled that many minutes after the alert if
    # the GPU is still idle. Exempt: interactive jobs (unless idle_interactive), the
    # users and accounts listed (comma-separated), jobs whose comment holds the word.
    idle_alert_min: float = 0.0
    idle_cancel_min: float = 0.0
    idle_interactive: bool = False
    idle_exempt_users: str = ""
    idle_exempt_accounts: str = ""
    idle_opt_out_word: str = "gpueff:idle-ok"
    idle_check_s: float = 60.0  # how often `gpueff-mail --watch` looks

    def __init__(self, path: str | None = None, hints: dict[str, str] | None = None,
                 **settings: Any) -> None:
        self.path = path
        for name, value in settings.items():
            if name not in SETTINGS:
                raise TypeError(f"Config() has no setting {name!r}")
            setattr(self, name, value)
        self.store_url = self.store_url or f"sqlite://{self.store_path}"
        self.store_read_url = self.store_read_url or self.store_url
        self.hints = dict(hints or {})

    def spool_for(self, node: str) -> str:
        return expand(self.spool_dir, node)

    def log_for(self, node: str) -> str:
        return expand(self.log_file, node)

    def mig_minors_for(self, node: str) -> str:
        return expand(self.mig_minors, node)

    def gpu_map_for(self, node: str) -> str:
        return expand(self.gpu_map_file, node)


# Every setting's name (the class's annotated attributes but the two __init__ takes itself)
SETTINGS = frozenset(Config.__annotations__) - {"path", "hints"}


def expand(template: str, node: str) -> str:
    return template.replace("%n", node or "unknown")


# (section, key, Config field, type)
_KEYS = [
    ("gpu", "library", "gpu_library", str),
    ("gpu", "mig_minors", "mig_minors", str),
    ("gpu", "map_file", "gpu_map_file", str),
    ("sim", "devices", "sim_devices", str),
    ("sim", "state_dir", "sim_state_dir", str),
    ("sim", "time_scale", "sim_time_scale", float),
    ("sim", "clock_offset_file", "sim_clock_offset_file", str),
    ("sampler", "interval_s", "interval_s", float),
    ("sampler", "checkpoint_s", "checkpoint_s", float),
    ("sampler", "live_s", "live_s", float),
    ("sampler", "stop_wait_s", "stop_wait_s", float),
    ("hooks", "timeout_s", "hook_timeout_s", float),
    ("hooks", "python", "python", str),
    ("spool", "dir", "spool_dir", str),
    ("spool", "retry_s", "retry_s", float),
    ("spool", "retry_max_s", "retry_max_s", float),
    ("spool", "retry_for_s", "retry_for_s", float),
    ("spool", "max_mb", "spool_max_mb", float),
    ("store", "path", "store_path", str),
    ("store", "url", "store_url", str),
    ("store", "read_url", "store_read_url", str),
    ("store", "admin_group", "store_admin_group", str),
    ("log", "file", "log_file", str),
    ("slurm", "sacct", "sacct", str),
    ("slurm", "slurmd", "slurmd", str),
    ("slurm", "squeue", "squeue", str),
    ("slurm", "admin_comment", "admin_comment", bool),
    ("slurm", "comment_field", "comment_field", str),
    ("slurm", "backend", "slurm_backend", str),
    ("slurm", "live_mirror_s", "live_mirror_s", float),
    ("slurm", "scontrol", "scontrol", str),
    ("slurm", "sacctmgr", "sacctmgr", str),
    ("report", "price_per_kwh", "price_per_kwh", float),
    ("report", "currency", "currency", str),
    ("report", "co2_g_per_kwh", "co2_g_per_kwh", float),
    ("report", "median_file", "median_file", str),
    ("mail", "enabled", "mail_enabled", bool),
    ("mail", "transport", "mail_transport", str),
    ("mail", "smtp_host", "mail_smtp_host", str),
    ("mail", "smtp_port", "mail_smtp_port", int),
    ("mail", "smtp_security", "mail_smtp_security", str),
    ("mail", "smtp_user", "mail_smtp_user", str),
    ("mail", "smtp_password_file", "mail_smtp_password_file", str),
    ("mail", "sendmail", "mail_sendmail", str),
    ("mail", "from", "mail_from", str),
    ("mail", "spool_dir", "mail_spool_dir", str),
    ("mail", "retry_s", "mail_retry_s", float),
    ("mail", "retry_max_s", "mail_retry_max_s", float),
    ("mail", "retry_for_s", "mail_retry_for_s", float),
    ("mail", "wait_s", "mail_wait_s", float),
    ("mail", "workers", "mail_workers", int),
    ("mail", "min_minutes", "mail_min_minutes", float),
    ("mail", "min_gpus", "mail_min_gpus", int),
    ("mail", "footer", "mail_footer", str),
    ("mail", "opt_out_file", "mail_opt_out_file", str),
    ("mail", "log_file", "mail_log_file", str),
    ("mail", "domain", "mail_domain", str),
    ("mail", "idle_alert_min", "idle_alert_min", float),
    ("mail", "idle_cancel_min", "idle_cancel_min", float),
    ("mail", "idle_interactive", "idle_interactive", bool),
    ("mail", "idle_exempt_users", "idle_exempt_users", str),
    ("mail", "idle_exempt_accounts", "idle_exempt_accounts", str),
    ("mail", "idle_opt_out_word", "idle_opt_out_word", str),
    ("mail", "idle_check_s", "idle_check_s", float),
    ("slurm", "scancel", "scancel", str),
    ("export", "textfile_dir", "export_dir", str),
    ("export", "labels", "export_labels", str),
]
# Settings where 0 says something (no live mirror but the end's; no minimum length).
_ZERO_MEANS = {"live_mirror_s", "mail_min_minutes", "idle_alert_min", "idle_cancel_min"}
_CHOICES = {"mail_transport": ("smtp", "sendmail"), "mail_smtp_security": ("none", "starttls", "tls"),
            "comment_field": ("AdminComment", "SystemComment"),
            "slurm_backend": ("auto", "commands", "pyslurm")}
_CHOICES["export_labels"] = ("job", "user")  # node/export.py's LABELS

# Settings where "" says something (no opt-out word); elsewhere "" is the default.
_EMPTY_MEANS = {"idle_opt_out_word"}
# Lists of names: a TOML array, or one comma-separated string.
_LISTS = {"idle_exempt_users", "idle_exempt_accounts"}
OLD_PATH = "/etc/slurm-gpu-eff/gpueff.conf"  # the INI file of versions before TOML


def effective(config: Config) -> dict[str, dict[str, object]]:
    """Every setting as it is in force, by section and key (`gpueff config`)."""
    out: dict[str, dict[str, object]] = {}
    for section, key, name, _ in _KEYS:
        out.setdefault(section, {})[key] = getattr(config, name)
    store = out["store"]  # the URLs the file gave, not the ones derived from path
    if store["url"] == f"sqlite://{config.store_path}":
        store["url"] = ""
    else:
        store["path"] = ""
    if config.store_read_url == config.store_url:
        store["read_url"] = ""
    if config.hints:
        out["hints"] = dict(config.hints)
    return out


def config_path(path: str | None = None) -> str:
    return path or os.environ.get("GPUEFF_CONFIG") or DEFAULT_PATH


def sacct_settings(path: str | None = None) -> tuple[str, str] | None:
    """`[slurm] sacct` and `comment_field` where the file's text alone says them, without
    the TOML reader (~6 ms to load, which `gpueff JOBID` would spend before it can start
    sacct): a file that names neither key (nor `backend`: pyslurm needs no sacct), nor holds
    a backslash (which a key spelt with escapes would need), leaves both at their defaults,
    whatever else it says. None
    otherwise, or where the file cannot be read: load_config() decides then. The file is
    still read whole by load_config() later, which says what is wrong with it, if anything."""
    try:
        with open(config_path(path), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return None
    if "sacct" in text or "comment_field" in text or "backend" in text or "\\" in text:
        return None
    defaults = Config()
    return defaults.sacct, defaults.comment_field


def load_config(path: str | None = None) -> Config:
    """Read the TOML file; raises ConfigError naming the file, and the key and its line."""
    explicit = path or os.environ.get("GPUEFF_CONFIG")
    path = config_path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError as exc:
        if explicit:  # a typo in a path someone gave must not fall back to defaults
            raise ConfigError(f"config file {path} does not exist") from exc
        if os.path.exists(OLD_PATH):  # an upgrade must not fall back to defaults either
            raise ConfigError(f"{OLD_PATH} is the old INI form: write it as {path} (TOML: strings "
                              "in quotes; etc/gpueff.toml.example)") from exc
        return Config(path=None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    return parse_config(text, path)


def parse_config(text: str, path: str) -> Config:
    raw = _toml(text, path)
    known = {(section, key): (name, kind) for section, key, name, kind in _KEYS}
    values: dict[str, object] = {}
    hints: dict[str, str] = {}
    for section, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{_where(path, text, '', section)}: settings go under a [section] "
                              "(see etc/gpueff.toml.example)")
        for key, value in table.items():
            where = _where(path, text, section, key)
            if section == "hints":  # the hints module knows its rules and checks these itself
                hints.update(_hint_settings(key, value))
                continue
            if (section, key) not in known:
                raise ConfigError(f"{where}: unknown setting")
            name, kind = known[(section, key)]
            if name in _LISTS and isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = ", ".join(value)  # a TOML array of names, or one comma-separated string
            checked = _typed(value, kind, where)
            if checked == "" and name not in _EMPTY_MEANS:
                continue
            _check_range(name, kind, checked, f"{where} = {value!r}")
            values[name] = checked
    config = Config(path, hints=hints, **values)
    # The shims kill a hook at 20 s; the epilog must still have time to post after waiting.
    if not config.hook_timeout_s <= 18:
        raise ConfigError(f"{path}: [hooks] timeout_s must be at most 18 (the shims stop a hook at 20)")
    if config.mail_workers < 1:
        raise ConfigError(f"{path}: [mail] workers must be at least 1")
    if not config.stop_wait_s < config.hook_timeout_s:
        raise ConfigError(f"{path}: [sampler] stop_wait_s must be under [hooks] timeout_s")
    if "store_url" in values and "store_path" in values:
        raise ConfigError(f"{path}: [store] has both url and path: keep one")
    if config.sim_time_scale != 1 and not config.sim_devices:
        raise ConfigError(f"{path}: [sim] time_scale needs [sim] devices (its clock starts there)")
    return config


def _toml(text: str, path: str) -> dict[str, object]:
    # here, not at the top: the standard library's TOML reader costs the hooks ~20 ms
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 (the tomli backport, a dependency there)
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message names the line and column
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


def _hint_settings(key: str, value: object) -> dict[str, str]:
    """[hints] as the hints module reads them: `low_util.warn_pct = 30` is a dotted key
    (a table in TOML) and comes back as "low_util.warn_pct"; a list is comma-separated."""
    if isinstance(value, dict):
        return {f"{key}.{k}": v for sub, item in value.items() for k, v in _hint_settings(sub, item).items()}
    return {key: ", ".join(map(str, value)) if isinstance(value, list) else str(value)}


_NAMES = {str: "a string in quotes", float: "a number", int: "a whole number", bool: "true or false"}


def _typed(value: object, kind: type, where: str) -> object:
    """The value as the setting's type; TOML's own types, never a guess from text."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{where} = {value!r}: must be {_NAMES[kind]}")


def _check_range(name: str, kind: type, value: object, said: str) -> None:
    """`said`: 'FILE, line N: [section] key = VALUE' as the file wrote it."""
    if kind is float:
        number = float(value)  # type: ignore[arg-type]
        if not (0 <= number < math.inf if name in _ZERO_MEANS else 0 < number < math.inf):
            raise ConfigError(f"{said}: must be a number greater than 0"
                              + (" (or 0)" if name in _ZERO_MEANS else ""))
    if kind is int and int(value) < 0:  # type: ignore[call-overload]
        raise ConfigError(f"{said}: must not be negative")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ConfigError(f"{said}: say {' or '.join(_CHOICES[name])}")


def _where(path: str, text: str, section: str, key: str) -> str:
    """'FILE, line N: [section] key' (the line found by a plain scan: tomllib gives none)."""
    current, line_no = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("[") and "]" in stripped:
            current = stripped[1:stripped.index("]")].strip().strip('"')
        elif current == section and stripped.partition("=")[0].strip().strip('"') == key:
            line_no = number
            break
    name = f"[{section}] {key}" if section else key
    return f"{path}, line {line_no}: {name}" if line_no else f"{path}: {name}"


# Where Slurm's commands usually are: a prolog's environment has no PATH of its own.
COMMAND_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/slurm/bin",
                "/opt/slurm/sbin")


def find_command(command: str) -> str:
    """A command as configured: a path stays as it is; a bare name is looked for on PATH,
    then in the usual places. Unfound, the name itself (running it then fails, and the
    caller says so)."""
    if "/" in command:
        return command
    # shutil.which's search, by hand: shutil costs `gpueff JOBID` ~2 ms to load
    for directory in [*os.environ.get("PATH", "").split(os.pathsep), *COMMAND_DIRS]:
        path = os.path.join(directory, command)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return command


def driver_clock(config: Config) -> Callable[[], float]:
    """The clock NVML's figures are in: the wall clock, or under `[sim] time_scale` the
    simulated GPUs' faster one, which starts at the simulated driver's load (the devices
    file's mtime), as the stand-in library's does."""
    scale = config.sim_time_scale
    if scale == 1:
        return time.time
    try:
        boot = os.stat(config.sim_devices).st_mtime_ns / 1e9
    except OSError as exc:
        raise ConfigError(f"cannot read the simulated devices {config.sim_devices}: {exc.strerror}") from exc
    return lambda: boot + (time.time() - boot) * scale


def sampler_clock(config: Config, node: str) -> Callable[[], float]:
    """The clock node `node`'s samplers date their readings by: the driver's, stepped by
    the seconds in `[sim] clock_offset_file` where a test names one (issue 20's soak steps
    one node's samplers' wall clock that way, never the machine's). Not the in-job
    workload's clock, which must stay the simulated driver's."""
    clock = driver_clock(config)
    if not config.sim_clock_offset_file:
        return clock
    return SteppedClock(clock, expand(config.sim_clock_offset_file, node))


class SteppedClock:
    """`clock` plus the number of seconds written in the file at `path` (a float), read
    at most once a second of `monotonic`; a missing or unreadable file, or one that holds
    no number (or one past 30 years either way) adds 0. Never raises: it is read in the
    sampler's loop."""

    def __init__(self, clock: Callable[[], float], path: str,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.path = path
        self.monotonic = monotonic
        self.offset = 0.0
        self.read_at: float | None = None

    def __call__(self) -> float:
        now = self.monotonic()
        if self.read_at is None or not 0 <= now - self.read_at < 1.0:
            self.read_at = now
            self.offset = self._read()
        return self.clock() + self.offset

    def _read(self) -> float:
        try:
            with open(self.path, "rb") as handle:
                text = handle.read(65)
            offset = float(text) if len(text) <= 64 else 0.0
        except (OSError, ValueError):
            return 0.0
        return offset if abs(offset) < 1e9 else 0.0  # inf and nan too
