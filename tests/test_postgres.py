"""The sweeper on a real PostgreSQL server: VITSWEEP_TEST_POSTGRES_URL (set by .ci/run, which starts a throwaway
server; by hand: `source .ci/postgres.sh && start_postgres`)."""

import os
import threading
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.vitsweep_sweeper import storage as sto
from tests.helpers import GRID, assert_each_point_once, sweep

pytestmark = pytest.mark.faults
ENV = "VITSWEEP_TEST_POSTGRES_URL"


@pytest.fixture
def pg_url():
    url = os.environ.get(ENV)
    if not url:
        pytest.skip(f"{ENV} is not set: no PostgreSQL server to test against (.ci/run starts one)")
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(sto.normalize(url), connect_args={"connect_timeout": 5})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{ENV}={sto.safe(url)} is not reachable: {type(e).__name__}: {e}")
    return url


def test_the_claim_lock_does_not_block_ask_in_the_same_process(pg_url):
    """The old row lock (SELECT ... FOR UPDATE held open) made study.ask() on a second connection wait forever."""
    storage = sto.open_storage(pg_url)
    study = optuna.create_study(study_name=f"lock-{uuid.uuid4().hex[:8]}", storage=storage)
    asked = []

    def claim():
        with sto.claim_lock(pg_url, storage, study._study_id):
            asked.append(study.ask())

    worker = threading.Thread(target=claim, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert asked and asked[0].number == 0, "study.ask() under the claim lock did not return within 60 s"


def test_two_workers_on_postgres_run_each_grid_point_once(tmp_path, pg_url):
    name = f"grid-{uuid.uuid4().hex[:8]}"
    # 1.5 s a trial: the first worker alone needs 9 s for the grid, time enough for the second to start and
    # claim (at 0.05 s the first one took all six trials while a loaded machine was still starting the second)
    proc = sweep(tmp_path, *GRID, "sleep_s=1.5", "hydra.sweeper.n_workers=2", "hydra.sweeper.n_trials=6",
                 "hydra.sweeper.sampler.seed=3", f"hydra.sweeper.storage='{pg_url}'",
                 f"hydra.sweeper.study_name={name}")
    study = optuna.load_study(study_name=name, storage=sto.open_storage(pg_url))
    assert_each_point_once(study)
    assert len({t.system_attrs["vitsweep:worker"] for t in study.trials}) == 2
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    logs = "".join(p.read_text() for p in (tmp_path / "workers").glob("*.log")) + proc.stdout + proc.stderr
    assert "deadlock" not in logs.lower() and "LockNotAvailable" not in logs
