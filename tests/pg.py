"""PostgreSQL for the tests: private servers from scripts/pg.sh, and engine-agnostic reads.

    with PgServer() as server:          # a fresh server in /var/tmp, on a free port
        open_store(server.url)           # role gpueff (password in the server's pgpass)
        rows(server.read_url, "select count(*) from node_summaries")  # role gpueff_read
        server.stop()                    # the database is down, its data kept
        server.start()                   # back, same port, same data
    # destroyed here (stopped, its directory removed)

A server runs as the Unix user `postgres`, so it needs root and Debian's postgresql
package (`available()` says whether both are there; `unavailable()` says what is
missing). Its directory is under /var/tmp, never pytest's tmp_path: /tmp/pytest-of-root
is 0700 and the user postgres cannot traverse it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.configfile import toml

REPO = Path(__file__).resolve().parents[1]
PG_SH = REPO / "scripts" / "pg.sh"
ENGINES = ("sqlite", "postgresql")


def unavailable() -> str | None:
    """Why no private server can run here (None: one can)."""
    if os.geteuid() != 0:
        return "a private PostgreSQL server needs root (it runs as the user postgres)"
    if not any(os.access(os.path.join(b, "initdb"), os.X_OK)
               for b in glob.glob("/usr/lib/postgresql/*/bin")):
        return "no PostgreSQL server under /usr/lib/postgresql (scripts/install-deps.sh installs it)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no Unix user postgres (Debian's postgresql package makes it)"
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        return f"psycopg cannot be imported ({exc}): pip install -e '.[postgres]'"
    return None


def available() -> bool:
    return unavailable() is None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pg_sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(PG_SH), *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise RuntimeError(f"pg.sh {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done


class PgServer:
    """A private PostgreSQL server in a new directory under `base`, started on creation.
    A context manager: destroyed (stopped, directory removed) on exit."""

    def __init__(self, base: str = "/var/tmp", port: int | None = None) -> None:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        self.dir = Path(tempfile.mkdtemp(prefix="gpueff-pg.", dir=base))
        os.chmod(self.dir, 0o755)  # the server, user postgres, must traverse it
        self.port = port or free_port()
        try:
            self._start(tries=1 if port else 3)
            self.url = pg_sh("url", str(self.dir)).stdout.strip()
            self.read_url = pg_sh("read-url", str(self.dir)).stdout.strip()
        except BaseException:
            self.destroy()
            raise

    def _start(self, tries: int) -> None:
        for attempt in range(tries):
            done = pg_sh("start", str(self.dir), str(self.port), check=False)
            if done.returncode == 0:
                return
            if attempt + 1 == tries or "Address already in use" not in done.stderr:
                raise RuntimeError(f"pg.sh start failed:\n{done.stdout}{done.stderr}")
            self.port = free_port()  # taken between our probe and the server's bind

    def start(self) -> None:
        """Start again (after stop()): same port, same data."""
        self._start(tries=1)

    def stop(self) -> None:
        """The database goes down (fast shutdown: clients are cut off); data kept."""
        pg_sh("stop", str(self.dir))

    def running(self) -> bool:
        return pg_sh("status", str(self.dir), check=False).returncode == 0

    def log(self) -> str:
        path = self.dir / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def destroy(self) -> None:
        if (self.dir / ".gpueff-pg").exists():
            pg_sh("destroy", str(self.dir))
        elif self.dir.exists():  # pg.sh never got as far as making it its own
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.destroy()


def engine_of(url: str) -> str:
    if url.startswith("sqlite://"):
        return "sqlite"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    raise ValueError(f"not a store URL: {url!r}")


def sqlite_url(path: str | Path) -> str:
    return f"sqlite://{Path(path).resolve()}"


def _postgres_sql(sql: str) -> str:
    """The tests' SQL uses sqlite3's `?` placeholders; psycopg's are `%s`."""
    return sql.replace("%", "%%").replace("?", "%s")


def rows(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run a read query on the store at `url` (sqlite:///PATH read-only, or
    postgresql://...) and return every row. Placeholders are `?` for both engines."""
    if engine_of(url) == "sqlite":
        path = url.removeprefix("sqlite://")
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            return [tuple(row) for row in db.execute(sql, tuple(params)).fetchall()]
        finally:
            db.close()
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        cursor = conn.execute(_postgres_sql(sql), tuple(params)) if params else conn.execute(sql)
        return [tuple(row) for row in cursor.fetchall()]


def execute(url: str, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one writing statement on the store at `url` (a writers' URL) and commit;
    returns the rows it touched. Placeholders are `?` for both engines."""
    if engine_of(url) == "sqlite":
        db = sqlite3.connect(url.removeprefix("sqlite://"), timeout=30)
        try:
            with db:
                return db.execute(sql, tuple(params)).rowcount
        finally:
            db.close()
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        cursor = conn.execute(_postgres_sql(sql), tuple(params)) if params else conn.execute(sql)
        return cursor.rowcount


@contextmanager
def store_down(url: str, pg_dir: str | Path | None = None) -> Iterator[None]:
    """The store at `url` is unusable for writers while inside: PostgreSQL stopped (the
    private server under `pg_dir`, started again on the way out), or the SQLite file held
    locked by a reader holding an exclusive transaction (let go on the way out)."""
    if engine_of(url) == "postgresql":
        if pg_dir is None:
            raise ValueError("store_down on PostgreSQL needs the server's directory")
        pg_sh("stop", str(pg_dir))
        try:
            yield
        finally:
            port = (Path(pg_dir) / "port").read_text().strip()
            pg_sh("start", str(pg_dir), port)
        return
    holder = sqlite3.connect(url.removeprefix("sqlite://"), timeout=30)
    holder.execute("begin exclusive")
    try:
        yield
    finally:
        holder.rollback()
        holder.close()


@dataclass
class StoreSite:
    """A store for a test of its own, on either engine: the [store] section that points a
    config at it, its URLs, and how to take it down for a while."""

    engine: str
    url: str  # the writers' (root: the PostgreSQL password is root's)
    read_url: str  # what `gpueff` reads with
    server: PgServer | None = None
    path: Path | None = None  # the SQLite file

    @classmethod
    def sqlite(cls, path: Path) -> StoreSite:
        url = sqlite_url(path)
        return cls("sqlite", url, url, path=Path(path))

    @classmethod
    def postgresql(cls, server: PgServer) -> StoreSite:
        return cls("postgresql", server.url, server.read_url, server=server)

    def sections(self) -> dict[str, dict[str, Any]]:
        """The config's [store] section; and no AdminComment mirror ([slurm]): the jobs of a
        test with a store of its own are not Slurm's."""
        mirror = {"admin_comment": False}
        if self.server is not None:
            return {"store": {"url": self.url, "read_url": self.read_url}, "slurm": mirror}
        return {"store": {"path": str(self.path)}, "slurm": mirror}

    def config(self) -> str:
        """sections() as TOML, newline-terminated (a config file holds each section once:
        a caller with a [store] or [slurm] of its own merges sections() instead)."""
        return toml(self.sections())

    def create(self) -> None:
        """Open and close it once as a writer: the schema is there (as after a first delivery)."""
        from slurm_gpu_eff.store import open_store

        open_store(self.url).close()

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return rows(self.url, sql, params)

    def down(self) -> AbstractContextManager[None]:
        """Unusable while inside: PostgreSQL stopped, or the SQLite file held locked."""
        return store_down(self.url, self.server.dir if self.server else None)


def as_json(body: Any) -> Any:
    """A summary's stored body as Python data, whether the engine hands back the JSON text
    (SQLite) or already decoded JSON (a jsonb column)."""
    import json

    return json.loads(body) if isinstance(body, (str, bytes, bytearray)) else body
