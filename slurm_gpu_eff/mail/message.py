"""The messages gpueff-mail sends: Slurm's plain notification, or the job-end report as
text and HTML (multipart/alternative; the HTML's charts are PNGs in the message).

Everything from the job (its name, comment, paths) is the user's: headers get it with
control characters and line breaks taken out (no header a job name could add), and the
HTML escapes it (jinja2's autoescape).
"""

from __future__ import annotations

import email.policy
import re
import socket
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

from ..report.render import render_mail_html, render_text
from ..report.shapes import GroupReport, JobReport
from .chart import HEIGHT, WIDTH, util_png
from .notice import Notice

# C0 and C1 controls (NEL, U+0085, is a line break to Python's email package) and the
# Unicode line and paragraph separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
SUBJECT_MAX = 400
# Headers on one line up to SMTP's 998 (Slurm's subject and the outcome fit): folded, a
# subject would be read back with a space in front.
POLICY = email.policy.default.clone(max_line_length=998)
# A recipient as Slurm passes it: one address or a user name, several split by commas.
_ADDRESS = re.compile(r"^[A-Za-z0-9._%+=~^{}!#$&'*?-]+(@[A-Za-z0-9][A-Za-z0-9.-]*)?$")


def header_safe(text: str, most: int = SUBJECT_MAX) -> str:
    """One line: control characters (CR, LF, ...) become a space, and long text is cut."""
    # "=?" would let a job name be read as an RFC 2047 encoded word (one that decodes to
    # a line break and a header): broken up, it is text
    line = _CONTROL.sub(" ", text).replace("=?", "= ?").strip()
    return line if len(line) <= most else line[: most - 1] + "\u2026"


def recipients(text: str, domain: str = "") -> list[str]:
    """The addresses in Slurm's RECIPIENT (its --mail-user: possibly a comma list); a
    value that is no address (a leading '-', spaces, angle brackets) is refused. A bare
    user name gets "@domain" ([mail] domain, as Slurm's MailDomain); an address keeps its
    own."""
    found = [part.strip() for part in text.split(",") if part.strip()]
    domain = domain.strip().lstrip("@")
    if domain:
        found = [part if "@" in part else f"{part}@{domain}" for part in found]
    bad = [part for part in found if not _ADDRESS.match(part) or part.startswith(("-", "|", "/", "."))]
    if bad or not found:
        raise ValueError(f"not a mail address: {header_safe(', '.join(bad) or text, 80)!r}")
    return found


def sender(configured: str) -> str:
    return configured or f"slurm@{socket.getfqdn()}"


def _base(notice: Notice, from_: str, subject: str) -> EmailMessage:
    return new_message(from_, recipients(notice.recipient), subject)


def new_message(from_: str, to: list[str], subject: str) -> EmailMessage:
    """Headers only; the subject made one safe line here."""
    message = EmailMessage(policy=POLICY)
    message["Subject"] = header_safe(subject)
    message["From"] = from_
    message["To"] = ", ".join(to)
    message["Date"] = formatdate(localtime=True)
    message["Message-ID"] = make_msgid(domain=from_.rpartition("@")[2] or None)
    message["Auto-Submitted"] = "auto-generated"  # no vacation replies to slurm@
    return message


def plain_notice(notice: Notice, from_: str, why: str = "") -> EmailMessage:
    """Slurm's own notification: its subject, and no body (as slurmctld's /bin/mail sends
    it), or one line saying why there is no report."""
    message = _base(notice, from_, notice.subject)
    message.set_content(why + "\n" if why else "")
    return message


def outcome(report: JobReport | GroupReport) -> str:
    """What the subject adds: 'GPU efficiency 23%: 1 of 2 GPUs idle'."""
    if isinstance(report, GroupReport):
        util = report.to_dict()["totals"]["gpu_util_mean"]
        idle = sum(len(r.idle_gpus) for r in report.reports)
        gpus = sum(len(r.gpus) for r in report.reports)
    else:
        util, idle, gpus = report.gpu_util_mean, len(report.idle_gpus), len(report.gpus)
    text = "GPU efficiency n/a" if util is None else f"GPU efficiency {util:.0f}%"
    return text + (f": {idle} of {gpus} GPUs idle" if idle else "")


def report_message(notice: Notice, from_: str, report: JobReport | GroupReport,
                   footer: str = "", extra: str = "") -> EmailMessage:
    """Slurm's subject with the outcome; the report as text and as HTML with charts."""
    message = _base(notice, from_, f"{header_safe(notice.subject)}; {outcome(report)}")
    text = render_text(report)
    tail = "\n".join(line for line in (extra, f"The same report: gpueff {notice.job_id}", footer) if line)
    message.set_content(text + "\n" + tail + "\n")
    if isinstance(report, GroupReport):  # an array's tasks: the table, as text in the HTML part
        return message
    pictures: list[tuple[str, bytes]] = []
    names: list[str | None] = []
    for g in report.gpus:
        points, _ = g.util_timeline()
        if not points:
            names.append(None)
            continue
        cid = make_msgid(domain="gpueff.invalid")
        pictures.append((cid, util_png(points)))
        names.append(cid[1:-1])
    html = render_mail_html(report, names, footer=footer, extra=extra, chart_size=(WIDTH, HEIGHT))
    message.add_alternative(html, subtype="html")
    html_part = message.get_payload()[1]  # type: ignore[index]
    assert isinstance(html_part, EmailMessage)
    for cid, data in pictures:
        html_part.add_related(data, maintype="image", subtype="png", cid=cid, filename="gpu-utilisation.png")
    return message
