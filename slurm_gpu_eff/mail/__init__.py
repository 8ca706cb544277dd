"""The job-end mail: gpueff-mail, Slurm's MailProg (prog.py), what Slurm asks of it
(notice.py), the messages (message.py, chart.py) and their spool and delivery (outbox.py)."""
