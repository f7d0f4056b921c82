"""A Hydra task for the sweeper tests, shaped like src/train.py: it reports a decreasing curve through the
sweeper's public protocol (its trial comes from the job's environment, never from its config), writes
metrics.jsonl and summary.json, and raises TrialPruned after the records are written when the pruner stops it.
With SWEEPER_APP_RESUME set, a run dir's metrics.jsonl is its checkpoint: a rerun there continues after its epochs.
A top-level `trial` key of the config is the user's own: the summary records it as `user_trial`.
With SWEEPER_APP_STANDALONE set, `import src` and `import analysis` fail in the app's processes. With `fail=true` (or
SWEEPER_APP_EXIT=n, which makes the task call sys.exit(n)) each attempt appends to the run dir's `attempts` file;
SWEEPER_APP_UNPICKLABLE makes its error one that does not unpickle. SWEEPER_APP_INTERRUPT=1 stops every job as
SIGTERM stops a run (SystemExit(143)); SWEEPER_APP_INTERRUPT=job<n> stops Hydra job #n only."""

import json
import math
import os
import sys
import time
from pathlib import Path

if os.environ.get("SWEEPER_APP_STANDALONE"):  # tests/test_sweeper_standalone.py: this process (and its workers, which
    sys.modules.update(src=None, analysis=None)  # inherit the variable) cannot import vitsweep's trainer or analysis

import hydra
import optuna
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.vitsweep_sweeper.protocol import current_trial, make_reporter


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig):
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if os.environ.get("SWEEPER_APP_EXIT_PROBE"):  # what a job leaves for its process's exit (test_launcher.py)
        exit_probe(run_dir)
    if cfg.fail:
        (run_dir / "attempts").open("a").write("1")
        if os.environ.get("SWEEPER_APP_UNPICKLABLE"):  # an exception that pickles but does not unpickle
            raise TwoArgumentError("lr", "must be > 0")
        raise RuntimeError("planted failure")
    interrupt = os.environ.get("SWEEPER_APP_INTERRUPT")  # an event from outside (SIGTERM), not the study's recipe:
    if interrupt == "1" or interrupt == f"job{HydraConfig.get().job.num}":  # every job, or Hydra job #n only
        raise SystemExit(143)  # what a run stopped by SIGTERM raises after its checkpoint
    if os.environ.get("SWEEPER_APP_EXIT"):  # the task's own sys.exit(n): each attempt appends to `attempts` too
        (run_dir / "attempts").open("a").write("1")
        sys.exit(int(os.environ["SWEEPER_APP_EXIT"]))
    trial = current_trial(run_dir)
    reporter = make_reporter(trial)
    final = cfg.x**2 + cfg.y**2 + (100.0 if cfg.bad else 0.0)
    stop_reason = "max_epochs"
    metrics, done = run_dir / "metrics.jsonl", []
    if os.environ.get("SWEEPER_APP_RESUME") and metrics.is_file():  # the app's checkpoint: its epochs so far
        done = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    with open(metrics, "a" if done else "w") as fh:
        for epoch in range(cfg.epochs):
            value = final + (cfg.epochs - 1 - epoch)  # reaches `final` at the last epoch
            if epoch >= len(done):  # a resumed run reports its saved epochs again, without redoing them
                fh.write(json.dumps({"epoch": epoch, "objective": value}) + "\n")
                fh.flush()
                time.sleep(cfg.sleep_s)
            if reporter is not None and reporter(value, epoch):
                stop_reason = "pruned"
                break
    summary = {"status": "stopped" if stop_reason == "pruned" else "completed", "stop_reason": stop_reason,
               "epochs": epoch + 1, "objective": final}
    if done:
        summary["resumed_from_epoch"] = len(done)
    if trial is not None:
        summary.update(study_name=trial.study_name, trial_number=trial.number, study_storage=trial.storage)
    if "trial" in cfg:
        summary["user_trial"] = OmegaConf.to_container(cfg.trial)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if stop_reason == "pruned":
        raise optuna.TrialPruned(f"pruned at epoch {epoch}")
    if cfg.nan:
        return math.nan
    if cfg.objectives == 2:
        return final, (cfg.x - 2) ** 2 + (cfg.y - 2) ** 2
    return final


class TwoArgumentError(ValueError):
    """An error whose ``__init__`` takes other arguments than its message, as some libraries' do: pickling keeps the
    message only, so unpickling calls ``__init__`` with one argument and fails."""

    def __init__(self, key: str, why: str):
        super().__init__(f"{key}: {why}")


def exit_probe(run_dir: Path) -> None:
    """An exit handler, as a tracker's that syncs at exit: it writes a file, logs a record that only logging's
    shutdown writes (a buffering handler that does not propagate) and prints with no newline and no flush. Hydra
    flushes the logs and streams after each job; only the worker's own exit can flush what its handlers leave."""
    import atexit
    import logging
    import logging.handlers

    logger = logging.getLogger(f"probe.{run_dir.name}")
    logger.propagate = False
    logger.addHandler(logging.handlers.MemoryHandler(1000, flushLevel=logging.CRITICAL + 1,
                                                     target=logging.FileHandler(run_dir / "probe.log")))

    def at_exit() -> None:
        (run_dir / "exit_handler").write_text("ran")
        logger.warning(f"logged at exit by {run_dir.name}")
        sys.stdout.write(f"printed at exit by {run_dir.name}")

    atexit.register(at_exit)


if __name__ == "__main__":
    main()
