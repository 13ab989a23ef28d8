"""Shared fixtures. Real parts only: a test that needs a system binary fails in CI when it is missing."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from faultcast.testing.system import missing_part

# -- hypothesis profiles -------------------------------------------------------------------------------
# FAULTCAST_HYPOTHESIS_PROFILE picks one; the default is "ci" when CI=true and "dev" otherwise.
# - ci:   derandomized (the same examples on every run: a red build is a real bug, and
#         FAULTCAST_HYPOTHESIS_PROFILE=ci replays it anywhere), 100 examples, no example database.
# - dev:  fresh random examples, 100 of them; a failure is saved in .hypothesis/ and replayed first.
# - fast: fresh random examples, 20 of them: the edit-run loop (`make fast`).
# In all three, no deadline and no `too_slow` health check: both time the test or its example
# generation on the wall clock, which on a shared machine (CI runners, parallel builds) measures the
# neighbours; speed is measured in bench/, never in a timed test. Every other health check stays on,
# `data_too_large` included: tests/test_fuzz.py sizes its strategies well inside hypothesis's budget.
_UNTIMED = [HealthCheck.too_slow]
settings.register_profile(
    "ci", derandomize=True, max_examples=100, database=None, deadline=None, suppress_health_check=_UNTIMED
)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=_UNTIMED)
settings.register_profile("fast", max_examples=20, deadline=None, suppress_health_check=_UNTIMED)
settings.load_profile(
    os.environ.get("FAULTCAST_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)


# -- the slow marker -----------------------------------------------------------------------------------
# `make test` runs every test; `make fast` (the edit-run loop) runs `pytest -m "not slow"`. A test is slow
# when it takes more than about a second on a quiet machine (two here, where the suite shares two cores):
# it trains a model, simulates days of fleet, or starts real processes and servers (Slurm, Prometheus,
# torchrun, Jupyter, Dask, `faultcast serve` and other `faultcast` commands). The marks are given here,
# in one place, from three explicit tables; each entry says why:
# - SLOW_FIXTURES: a test that uses one of these fixtures (directly or through another) is slow. A bare
#   name is one of this file's fixtures; "tests/FILE.py::name" one of that module's.
# - SLOW_MODULES: every test in the module is slow.
# - SLOW_TESTS: by module, test names (without [parameters]: all of them are slow).
# To mark a new slow test: when its slowness is a fixture's set-up, add the fixture to SLOW_FIXTURES;
# otherwise add the test to SLOW_TESTS (or decorate it with @pytest.mark.slow). Find candidates with
# `pytest -m "not slow" --durations=20`; `pytest -m slow --collect-only -q` lists what is marked.
# An entry that no longer names a test or fixture (a rename) is reported as a warning. Tests that are
# stages of one story on a module-scoped fixture (tests/test_service.py) are marked all or none.
# `service_model` trains the demo model, about a minute, so its tests are slow unless
# FAULTCAST_TEST_SERVICE_MODEL names a model trained that way: then it costs nothing, and the tests that
# use it join the fast loop unless they are slow on their own (listed below for that case).
# A test whose outcome cannot depend on the model's quality (authentication, limits, reflection, health,
# admin calls, registration, plumbing) takes `stub_model` instead: a real artifact built in milliseconds
# that never alerts, so it is not slow on that account. Only a test that needs a precursor caught (or
# scores that mean something) takes `service_model`.
SLOW_FIXTURES = {
    "service_model": "trains the demo model (unless FAULTCAST_TEST_SERVICE_MODEL names one)",
    "tests/test_retrain.py::fleet_state": "simulates a 3-day twin and archives it (a retrain then trains on it)",
    "tests/test_archive.py::twin": "simulates a fleet twin to hold the archive against",
    "tests/test_model.py::data": "simulates a fleet twin (and `trained` trains on it)",
    "tests/test_import_score.py::model_dir": "trains a model",
    "tests/test_import_score.py::scored_data": "simulates and scores a fleet twin",
    "tests/test_features.py::week": "simulates a week of fleet",
    "tests/test_world.py::healthy": "simulates a healthy fleet in a world where look-alikes are common",
    "tests/test_world.py::accelerated": "simulates an accelerated fleet and sums it per GPU-hour",
    "tests/test_client_snapshots.py::uninterrupted": "a multi-process guarded training run",
    "tests/test_client_snapshots.py::crashed": "a multi-process guarded training run, crashed and rerun",
    "tests/test_notebooks.py::kernel": "a Jupyter kernel",
    "tests/test_dcgm_parity.py::prometheus": "a real Prometheus scraping two `faultcast collect`",
    "tests/test_calibrate.py::fleet": "simulates a 4-day fleet (and `calibrated` scores it)",
    "tests/test_calibrate.py::twin": "simulates a fleet twin and replays it through the features",
    "tests/test_ceiling.py::fleets": "simulates fleet twins (`reference` trains on them, `evaluated` scores)",
    "tests/test_mode_acceleration.py::worlds": "simulates two fleet twins (a test trains on them)",
}
SLOW_MODULES = {
    "tests/test_client_e2e.py": "torchrun jobs on a real Slurm cluster",
    "tests/test_handover_e2e.py": "torchrun jobs and their standbys on a real Slurm cluster",
    "tests/test_examples.py": "the examples' training runs (torchrun)",
    "tests/test_dask.py": "a Dask LocalCluster",
    "tests/test_demo.py": "`faultcast demo`",
    "tests/test_bench_service.py": "the service benchmark",
    "tests/test_bench_client.py": "the client benchmark",
    "tests/test_ingest_crash.py": "`faultcast serve` killed and restarted",
    "tests/test_service_restart.py": "`faultcast serve` killed and restarted",
    "tests/test_restart_mid_incident.py": "`faultcast serve` killed and restarted",
    "tests/test_pace.py": "a node's samples pushed at three paces, one a second: 19,000 pushes",
    "tests/test_prometheus_scrape.py": "a real Prometheus",
    "tests/test_import_url.py": "a real Prometheus scraping a real `faultcast collect` for 40 s",
    "tests/test_cli.py": "`faultcast` commands in subprocesses",
    "tests/test_train_groups.py": "trains across four worlds with folds and pooled validation",
}
SLOW_TESTS = {
    "tests/test_simulate_family.py": {
        "test_the_trace_family_writes_a_calibrated_world_over_the_drawn_one": "simulates a small trace-family fleet",
    },
    "tests/test_warm_start.py": {
        "test_a_warm_start_reads_the_same_features_or_says_why_not": "loads the shipped model twice",
    },
    "tests/test_dashboard_dcgm_exporter.py": {
        "test_every_panel_shows_data_on_a_stock_dcgm_exporter_or_says_what_it_needs": (
            "a real Prometheus scraping a stock dcgm-exporter's counters"
        ),
    },
    "tests/test_messages.py": {
        "test_train_refuses_saying_what_it_got_and_how_much_data_would_do": "simulates the issue's 16-node twin",
        "test_serve_s_refusal_is_one_line_on_stderr": "a `faultcast serve` process",
    },
    "tests/test_buddy_replicas.py": {
        "test_a_node_and_its_buddy_lost_leave_no_whole_replica": "two 3-rank torchrun jobs",
        "test_protection_goes_on_from_the_newer_of_the_replicas_and_the_files": "five 3-rank torchrun jobs",
    },
    "tests/test_tier_e2e.py": {
        "test_a_weak_warning_buys_replicas_while_it_lasts_and_a_strong_one_moves_the_job": (
            "two 2-rank torchrun jobs and the twin pushed sample by sample"
        ),
    },
    "tests/test_node_replacement.py": {
        "test_on_slurm_a_node_killed_with_its_slurmd_is_replaced_by_the_warm_spare_bit_identical": (
            "a 4-node Slurm cluster and 4 torchrun agents"
        ),
        "test_on_slurm_a_predicted_failure_hands_the_warned_nodes_part_over_live_and_loses_no_step": (
            "4 torchrun agents on Slurm and the twin pushed sample by sample"
        ),
    },
    "tests/test_mode_acceleration.py": {
        "test_a_boosted_mode_is_drawn_that_much_more_often_and_the_others_are_not": "400 nodes' schedules",
    },
    "tests/test_world.py": {
        "test_precursors_are_drawn_per_failure_and_some_degradations_stop": "128 nodes' schedules",
        "test_degradations_that_stop_without_failing_come_at_the_real_rate": "512 nodes' schedules",
    },
    "tests/test_twin.py": {
        "test_the_simulate_command_writes_the_four_files": "`faultcast simulate`",
        "test_the_same_seed_writes_the_same_files_and_another_seed_does_not": "3 runs",
        "test_collect_runs_the_twin_at_speed_and_fails_a_gpu_on_cue": "`faultcast collect`",
        "test_confounders_happen_and_cause_no_failure": "a fleet simulation",
    },
    "tests/test_client_snapshots.py": {
        "test_one_ranks_vote_reaches_every_rank_at_that_step_only": "processes",
    },
    "tests/test_dcgm_parity.py": {
        "test_collect_once_offers_the_canonical_names_behind_a_flag": "subprocesses",
    },
    "tests/test_sim_realtime.py": {
        "test_collect_starts_a_fast_twin_hours_back_by_default_and_keeps_sim_start": "`faultcast collect`",
        "test_collect_refuses_a_start_in_the_future_and_contradicting_flags": "`faultcast collect`",
        "test_a_collector_at_240x_is_taken_whole_by_a_service_with_default_limits": "`faultcast collect`",
        "test_a_twin_that_catches_up_goes_on_at_real_time_and_is_still_taken_whole": "`faultcast collect`",
    },
    "tests/test_docs.py": {
        "test_the_metric_page_matches_the_catalogue": "`faultcast metrics`",
    },
    "tests/test_import_score.py": {
        "test_a_finer_cadence_is_kept_and_values_match_the_originals": "imports a twin at a 15 s cadence",
    },
    "tests/test_remediation_retry.py": {
        "test_a_remediation_cut_off_by_sigkill_is_carried_on_at_the_next_start": "a Python child, killed",
    },
    "tests/test_shipping.py": {
        "test_a_ten_minute_outage_at_1s_loses_no_sample": "600 samples through a spool",
    },
    "tests/test_slurm.py": {
        "test_requeued_job_restarts_on_another_node": "waits out Slurm's credential expiry",
        "test_a_standby_runs_the_jobs_own_script_away_from_the_doomed_node_and_release_cancels_it": (
            "a standby job started and cancelled"
        ),
    },
    "tests/attacks/test_remediation_full_disk.py": {
        "test_the_worker_survives_a_full_disk_and_drains_once_space_comes_back": (
            "retries on the remediator's backoff"
        ),
    },
    # These use `stub_model` (fast): they are slow on their own.
    "tests/test_security.py": {
        "test_serve_with_tls_and_tokens_takes_every_sample_a_collector_ships": "processes",
        "test_serve_refuses_to_start_without_tls_or_an_explicit_insecure": "`faultcast serve`",
    },
    "tests/attacks/test_starvation.py": {
        "test_serve_exits_on_sigterm_with_watch_streams_and_a_subscription_open": "`faultcast serve`",
    },
    "tests/attacks/test_state_database.py": {
        "test_serve_on_a_damaged_database_exits_with_one_line_naming_the_file": "`faultcast serve`",
    },
    "tests/attacks/test_threads.py": {
        "test_a_cursor_thread_that_dies_is_restarted_counted_and_saves_again": (
            "waits for the supervisor's restart"
        ),
    },
    "tests/test_failed_events.py": {
        "test_a_collector_killed_or_hung_is_a_silent_node_and_one_that_stops_cleanly_is_not": (
            "`faultcast collect` processes killed, hung and stopped"
        ),
    },
    "tests/test_stub_coexistence.py": {
        "test_their_stubs_and_faultcast_load_together_and_call_a_real_service": "protoc and a Python child",
    },
    # The rest use `service_model`; they are listed for runs with FAULTCAST_TEST_SERVICE_MODEL set.
    "tests/test_goodput.py": {
        "test_the_goodput_command_prints_the_three_policies_recommends_a_threshold_and_plots": (
            "`faultcast goodput`"
        ),
    },
    "tests/test_service_parts.py": {
        "test_the_service_raises_and_clears_exactly_the_incidents_the_offline_evaluation_counts": (
            "a fleet twin through the service"
        ),
    },
    "tests/attacks/test_crash_remediation.py": {
        "test_a_crash_loop_does_not_reset_the_circuit_breaker": "`faultcast serve` killed in a loop",
        "test_a_drain_whose_deadline_passed_while_the_service_was_down_comes_at_once_after_restart": (
            "`faultcast serve` killed and restarted"
        ),
    },
    "tests/test_client_adapters.py": {
        "test_the_lightning_callback_checkpoints_periodically_and_skips_partial_snapshots": (
            "a Lightning training run"
        ),
        "test_the_lightning_callback_snapshots_on_an_alert_and_the_job_resumes_from_it": (
            "a Lightning training run"
        ),
        "test_the_hugging_face_callback_saves_on_an_alert_and_the_trainer_resumes_from_it": (
            "a Hugging Face training run"
        ),
    },
    "tests/test_guard.py": {
        "test_the_guard_asks_for_a_snapshot_and_its_acknowledgement_drains_the_node": (
            "a twin precursor through the service"
        ),
    },
    "tests/attacks/test_full_disk.py": {
        "test_alerts_raised_while_the_state_disk_is_full_are_kept_and_delivered_when_space_returns": (
            "a twin precursor through the service"
        ),
        "test_while_the_state_disk_is_full_admins_are_answered_and_writes_say_unavailable": (
            "a twin precursor through the service"
        ),
    },
    "tests/attacks/test_time_gap.py": {
        "test_a_jump_in_event_time_leaves_the_service_answering_and_the_victim_alerted": (
            "a twin precursor through the service"
        ),
    },
    "tests/attacks/test_wire_integers.py": {
        "test_a_sequence_beyond_2_63_is_refused_and_every_node_still_gets_its_alert": (
            "a twin precursor through the service"
        ),
    },
}


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: the stale-entry check sees every test
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fixtures = dict(SLOW_FIXTURES)
    if os.environ.get("FAULTCAST_TEST_SERVICE_MODEL"):
        del fixtures["service_model"]
    entries = {*fixtures, *SLOW_MODULES, *(f"{m}::{t}" for m, tests in SLOW_TESTS.items() for t in tests)}
    used: set[str] = set()
    modules: set[str] = set()
    for item in items:
        module, _, name = item.nodeid.partition("::")
        modules.add(module)
        names = {module, f"{module}::{name.split('[')[0]}"}
        for fixture in getattr(item, "fixturenames", ()):
            names |= {fixture, f"{module}::{fixture}"}
        hits = names & entries
        if hits:
            item.add_marker(pytest.mark.slow)
            used |= hits
    if any("::" in arg for arg in config.args):
        return  # only some tests of a module were collected: an entry unused proves nothing
    for entry in sorted(entries - used):
        module = entry.partition("::")[0]
        if module in modules or (module.endswith(".py") and not (config.rootpath / module).is_file()):
            warnings.warn(
                f"tests/conftest.py marks {entry} slow, but no test is or uses it (renamed?): "
                "update SLOW_FIXTURES, SLOW_MODULES or SLOW_TESTS",
                pytest.PytestWarning,
                stacklevel=1,
            )


@pytest.fixture(scope="session")
def service_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model good enough to catch a clear HBM precursor, for the service's tests: the demo model
    (faultcast.demo.model: a 32-node twin over 6 days at 200x the failure rate, few trees). For a faster
    edit-run loop, FAULTCAST_TEST_SERVICE_MODEL names a model directory trained that way to use instead
    (never set in CI)."""
    cached = os.environ.get("FAULTCAST_TEST_SERVICE_MODEL")
    if cached:
        return Path(cached)
    from faultcast.demo.model import train_demo_model

    return train_demo_model(tmp_path_factory.mktemp("service-model"), tmp_path_factory.mktemp("service-data"))


@pytest.fixture(scope="session")
def stub_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model artifact that loads like any other (`Service.open`, `faultcast serve --model`) but
    is built in milliseconds and never alerts (faultcast.testing.stub_model): for the tests whose
    outcome cannot depend on the model. A test that needs an alert from samples takes `service_model`."""
    from faultcast.testing.stub_model import stub_model as build

    return build(tmp_path_factory.mktemp("stub-model") / "model")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs) to fill up. Mounting needs root: outside CI the tests that
    use it are skipped without; in CI (CI=true) they fail instead, so the check cannot go quiet."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}"
        missing_part(reason)
    try:
        yield where
    finally:
        # Lazily: a test that failed may still hold a spool open there.
        subprocess.run(["umount", "--lazy", str(where)], check=True)
