"""Shared pytest set-up: the tests see the scripts' own defaults, whatever the developer's shell exports."""
import os

import pytest
import torch

import common
import results


def pytest_configure(config):
    """Under pytest-xdist the workers share the cores: each worker's torch, and every process it starts (children
    inherit OMP_NUM_THREADS), takes its share of threads, so that the workers do not oversubscribe the cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """The tests of a module that share its costly fixture (one spawn, one nsys run, read by several tests) go to
    one xdist worker (--dist loadgroup), so that fixture runs once."""
    for item in items:
        if any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


TINY_CALIBRATION = {"budget_s": 0.05, "max_matmul": {"cpu": 64, "cuda": 256},
                    "copy_bytes": {"cpu": 2**20, "cuda": 2**20}}


@pytest.fixture(autouse=True)
def no_handout_from_the_shell(monkeypatch):
    """CS336_HANDOUT picks the default handout; a test that wants it sets it (child processes inherit this)."""
    monkeypatch.delenv(results.HANDOUT_ENV, raising=False)


@pytest.fixture(autouse=True, scope="session")
def seeded_ceilings(tmp_path_factory):
    """Every script the tests run (in this process or a child) reads this machine's ceiling from one file, measured
    once at a tiny size: no test pays for a calibration but those of the calibration itself."""
    path = tmp_path_factory.mktemp("ceilings") / common.CEILINGS_FILE
    before = os.environ.get(common.CEILINGS_ENV)
    os.environ[common.CEILINGS_ENV] = str(path)
    common.machine_ceiling(torch.device("cpu"), str(path.parent), calibration=TINY_CALIBRATION)
    yield path
    if before is None:
        os.environ.pop(common.CEILINGS_ENV, None)
    else:
        os.environ[common.CEILINGS_ENV] = before


@pytest.fixture
def scripted_ranks(monkeypatch):
    """parallel.SpawnedRanks as the parent sees it, no processes: each start answers the next script of messages
    (append scripts to the returned list); its `started` keeps what each start was given."""
    class Scripts(list):
        started: list[tuple]

    scripts = Scripts()
    scripts.started = []

    class ScriptedRanks:
        def __init__(self, fn, args, world_size, store):
            scripts.started.append(args)
            self.messages = scripts.pop(0)

        def next_message(self, timeout_s):
            return self.messages.pop(0)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    import parallel
    monkeypatch.setattr(parallel, "SpawnedRanks", ScriptedRanks)
    return scripts


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker more than the usable cores, since many tests wait (on a child's start, a hang's time
    limit, a signal's delivery) and the extra worker runs meanwhile."""
    return len(os.sched_getaffinity(0)) + 1
