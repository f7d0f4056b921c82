"""Storages and the claim lock: SQLite (one machine), Optuna's journal file, PostgreSQL or MySQL.

URLs: `sqlite:///path.db`, `journal:///abs/path.log` (or `journal://rel/path.log`), any SQLAlchemy URL
(`postgresql+psycopg://user:pw@host/db`, `mysql+pymysql://...`). A URL whose driver is missing fails here,
before any trial, naming the extra to install.
"""

import contextlib
import importlib
import importlib.util
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna

from . import _protocol as protocol

log = logging.getLogger(__name__)

SQLITE_TIMEOUT_S = 120  # how long a worker waits for another one's SQLite write lock
CONNECT_TIMEOUT_S = 15  # how long opening a PostgreSQL or MySQL connection may take
LOCK_NAMESPACE = 0x76697473  # first key of the PostgreSQL advisory lock ("vits"); the second is the study id
DRIVERS = {  # SQLAlchemy dialect -> (module it imports, how to get it)
    "postgresql": ("psycopg2", "pip install 'vitsweep[postgres]' and use postgresql+psycopg://..."),
    "postgresql+psycopg": ("psycopg", "pip install 'vitsweep[postgres]' (psycopg 3)"),
    "postgresql+psycopg2": ("psycopg2", "pip install psycopg2-binary, or 'vitsweep[postgres]' with postgresql+psycopg://"),
    "mysql": ("MySQLdb", "pip install mysqlclient, or PyMySQL with mysql+pymysql://..."),
    "mysql+pymysql": ("pymysql", "pip install PyMySQL"),
}


def journal_path(url: str) -> str | None:
    return url[len("journal://") :] if url.startswith("journal://") else None


def sqlite_path(url: str) -> str | None:
    return url[len("sqlite:///") :] if url.startswith("sqlite:///") else None


def normalize(url: str) -> str:
    """`postgresql://` means psycopg2 to SQLAlchemy; with only psycopg 3 installed (the `postgres` extra) use it."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and sep and not _has("psycopg2") and _has("psycopg"):
        return f"postgresql+psycopg://{rest}"
    return url


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def safe(url: str) -> str:
    """The URL with its password hidden, for logs and errors."""
    if journal_path(url) is not None or "@" not in url:
        return url
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _check_driver(url: str) -> None:
    scheme = url.split("://", 1)[0]
    module, fix = DRIVERS.get(scheme, (None, ""))
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"hydra.sweeper.storage: {safe(url)!r} needs the Python module {module!r}, which cannot be "
                         f"imported ({e}): {fix}") from e


def open_storage(url: str, existing: bool = False) -> optuna.storages.BaseStorage:
    """Open (and create the tables of) a storage; errors name `hydra.sweeper.storage`.
    `existing=True` skips the table and version checks (a job opening its sweeper's storage)."""
    url = normalize(url)
    path = journal_path(url)
    try:
        if path is not None:
            if not Path(path).parent.is_dir():
                raise FileNotFoundError(f"no directory {Path(path).parent}")
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(path))
        _check_driver(url)
        engine_kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
        elif url.startswith(("postgresql", "mysql")):
            engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        return _rdb_storage(url, engine_kwargs, existing)
    except Exception as e:  # noqa: BLE001 - any driver error means the same thing to the user
        if str(e).startswith("hydra.sweeper.storage"):  # our own message (a missing driver) as it is
            raise
        raise ValueError(f"hydra.sweeper.storage: cannot open {safe(url)!r}: {type(e).__name__}: {e}") from e


CREATE_TRIES = 5


def _rdb_storage(url: str, engine_kwargs: dict[str, Any], existing: bool) -> optuna.storages.RDBStorage:
    """An RDBStorage whose creation survives workers starting on a new storage at once. Optuna creates the tables
    and inserts the version rows without a guard, so the second of two processes can fail with an IntegrityError
    (UNIQUE constraint on alembic_version) or "table already exists". SQLite: the workers of one machine take the
    claim flock beside the file while creating; any database: a creation that lost the race is retried, and then
    finds what the other process committed."""
    import sqlalchemy.exc

    local = sqlite_path(url)
    guard = local is not None and not existing and Path(local).parent.is_dir()

    def create() -> optuna.storages.RDBStorage:
        with protocol.file_lock(f"{local}.claim") if guard else contextlib.nullcontext():
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, skip_compatibility_check=existing, skip_table_creation=existing
            )

    for attempt in range(CREATE_TRIES - 1):
        try:
            return create()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError) as e:
            if existing or not (isinstance(e, sqlalchemy.exc.IntegrityError) or "already exists" in str(e)):
                raise
            log.info(f"storage creation raced another worker ({type(e).__name__}); opening it again")
            time.sleep(0.2 * (attempt + 1))
    return create()  # the last try: its error, if any, is the user's


@contextlib.contextmanager
def claim_lock(url: str, storage: optuna.storages.BaseStorage, study_id: int) -> Iterator[None]:
    """Serialise "reap, count the budget, then ask" across workers so a study never overshoots n_trials.

    SQLite and journal files: an flock next to the file (workers on this machine). PostgreSQL: a
    session advisory lock on an autocommit connection (no open transaction, so it cannot wait on
    Optuna's own row locks); MySQL: GET_LOCK.
    """
    url = normalize(url)
    local = sqlite_path(url) or journal_path(url)
    if local is not None:
        with protocol.file_lock(f"{local}.claim"):
            yield
        return
    engine = getattr(storage, "engine", None)
    if engine is None:  # in-memory storage: one process only
        yield
        return
    import sqlalchemy

    if engine.dialect.name == "postgresql":
        take, drop = "SELECT pg_advisory_lock(:a, :b)", "SELECT pg_advisory_unlock(:a, :b)"
    elif engine.dialect.name == "mysql":
        take, drop = "SELECT GET_LOCK(CONCAT('vitsweep', :a, '-', :b), 3600)", \
            "SELECT RELEASE_LOCK(CONCAT('vitsweep', :a, '-', :b))"
    else:
        raise ValueError(f"hydra.sweeper.storage: no claim lock for {engine.dialect.name}; use SQLite, a journal "
                         "file, PostgreSQL or MySQL")
    keys = {"a": LOCK_NAMESPACE, "b": int(study_id)}
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(sqlalchemy.text(take), keys)
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text(drop), keys)
