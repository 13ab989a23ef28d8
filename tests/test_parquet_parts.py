"""Tables split into files (model/features/parquet_parts.py): telemetry.parquet and network.parquet as
directories of day files, as the service's rolling archive writes them, read like the single files.

A twin's data directory is split by day (the second day one level deeper, in two parts; the network's
first day a symlink; a hive-style folder name; files that are no table beside them) and every reader is
held to the file's answer: the replayed features step for step, training's sampled rows, the visibility
report, the separability of each mode, the plotted signals, and `faultcast score`."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from faultcast import cli
from faultcast.model.evaluation.report import read_telemetry
from faultcast.model.evaluation.separability import report_rows, separability
from faultcast.model.evaluation.visibility import present_inputs
from faultcast.model.features.engine import GPU_INPUTS, NODE_INPUTS, FeatureConfig
from faultcast.model.features.offline import DataError, Dataset, Step, open_dataset, replay
from faultcast.model.features.parquet_parts import ParquetParts, part_files, table_exists
from faultcast.model.training.train import TrainConfig, _world_rows, world_rows_key
from faultcast.sim.config import FleetConfig
from faultcast.sim.schedule import Scenario
from faultcast.sim.writer import simulate
from faultcast.step_summary import SCRAPES_COLUMN, SUMMARY_COLUMNS

TWIN = FleetConfig(nodes=2, gpus_per_node=4, days=1.5, seed=23, acceleration=200.0)
SCENARIOS = [Scenario("hbm_wear", 1, 2, 0.9 * 86_400.0), Scenario("infiniband", 0, None, 1.2 * 86_400.0)]
DAY_NS = 86_400 * 10**9
QUARTER_NS = DAY_NS // 4


def _write(table: pa.Table, path: Path, pieces_ns: int) -> None:
    """`table` (time ordered) at `path`, one row group per `pieces_ns` of time: several groups a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = table.column("timestamp").cast(pa.int64()).to_numpy()
    with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
        for piece in np.unique(stamp // pieces_ns):
            writer.write_table(table.filter(pa.array(stamp // pieces_ns == piece)))


def _split(src: Path, out: Path) -> Path:
    """`src` with both tables split by UTC day: `TABLE/2026-01-05.parquet` (network's a symlink to a file
    elsewhere), then the second day in two parts one level down (network's folder named hive-style), with
    a hidden file, a `_SUCCESS` marker and a README that are no table."""
    out.mkdir()
    for name in ("failures.csv", "manifest.json"):
        shutil.copy(src / name, out / name)
    for name in ("telemetry.parquet", "network.parquet"):
        table = pq.read_table(src / name)
        stamp = table.column("timestamp").cast(pa.int64()).to_numpy()
        days = stamp // DAY_NS
        for k, day in enumerate(np.unique(days)):
            rows = table.filter(pa.array(days == day))
            label = pd.Timestamp(int(day) * DAY_NS, tz="UTC").strftime("%Y-%m-%d")
            if k == 0 and name == "network.parquet":
                _write(rows, out / "elsewhere" / f"{label}.parquet", QUARTER_NS)
                (out / name).mkdir()
                (out / name / f"{label}.parquet").symlink_to(out / "elsewhere" / f"{label}.parquet")
            elif k == 0:
                _write(rows, out / name / f"{label}.parquet", QUARTER_NS)
            else:
                folder = out / name / (f"day={label}" if name == "network.parquet" else label)
                morning = pa.array(stamp[days == day] % DAY_NS < QUARTER_NS)
                _write(rows.filter(morning), folder / "part-000000.parquet", QUARTER_NS // 2)
                _write(rows.filter(pc.invert(morning)), folder / "part-000001.parquet", QUARTER_NS)
        (out / name / ".2026-01-07.parquet").write_bytes(b"a writer's file in progress")
        (out / name / "_SUCCESS").write_bytes(b"")
        (out / name / "README.txt").write_text("one file a day\n")
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the twin's data directory, the same data split into day files)."""
    root = tmp_path_factory.mktemp("parts")
    simulate(TWIN, root / "file", SCENARIOS)
    return root / "file", _split(root / "file", root / "split")


def _steps(
    dataset: Dataset, config: FeatureConfig, window: tuple[list[int] | None, float | None, float | None]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def keep(step: Step) -> None:
        out[step.index] = (step.present.copy(), step.features.copy())

    nodes, start_s, end_s = window
    replay(dataset, config, keep, nodes=nodes, start_s=start_s, end_s=end_s)
    return out


# -- the tables themselves ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_split_tables_list_their_files_in_name_order_and_skip_what_is_no_table(
    dirs: tuple[Path, Path],
) -> None:
    file, split = dirs
    names = [
        f.relative_to(split / "network.parquet").as_posix() for f in part_files(split / "network.parquet")
    ]
    assert names == [
        "2026-01-05.parquet",
        "day=2026-01-06/part-000000.parquet",
        "day=2026-01-06/part-000001.parquet",
    ]
    for name in ("telemetry.parquet", "network.parquet"):
        whole, parts = pq.read_table(file / name), ParquetParts(split / name)
        assert parts.num_row_groups > len(parts.files) == 3  # several row groups a file
        assert parts.num_rows == whole.num_rows
        # No column from the hive-style folder name, the rows in time order as in the file.
        pd.testing.assert_frame_equal(parts.read().to_pandas(), whole.to_pandas())  # NaN equal to NaN
        assert parts.schema_arrow.equals(whole.schema, check_metadata=False)
        groups = pa.concat_tables([parts.read_row_group(i) for i in range(parts.num_row_groups)])
        pd.testing.assert_frame_equal(groups.to_pandas(), whole.to_pandas())


# -- every reader, held to the file's answer ------------------------------------------------------------


@pytest.mark.slow
def test_replay_of_split_tables_gives_the_files_features_step_for_step(dirs: tuple[Path, Path]) -> None:
    file, split = dirs
    config = FeatureConfig(cadence_s=TWIN.cadence_s, gpus_per_node=TWIN.gpus_per_node)
    day = 86_400.0
    # All of it; then one node from the middle of a row group to the middle of the second day's first part.
    for window in [(None, None, None), ([1], TWIN.start_unix_s + 0.4 * day, TWIN.start_unix_s + 1.1 * day)]:
        expected = _steps(open_dataset(file), config, window)
        got = _steps(open_dataset(split), config, window)
        assert sorted(got) == sorted(expected)
        for step, (present, features) in expected.items():
            np.testing.assert_array_equal(got[step][0], present, err_msg=f"step {step}")
            np.testing.assert_array_equal(got[step][1], features, err_msg=f"step {step}")
    assert any(np.isfinite(f[p]).any() for p, f in expected.values())


@pytest.mark.slow
def test_training_samples_the_same_rows_from_split_tables(dirs: tuple[Path, Path]) -> None:
    file, split = dirs
    features = FeatureConfig(cadence_s=TWIN.cadence_s, gpus_per_node=TWIN.gpus_per_node)
    config = TrainConfig(negative_rate=0.05)
    expected, names = _world_rows(open_dataset(file), features, config, 4)
    got, got_names = _world_rows(open_dataset(split), features, config, 4)
    assert got_names == names
    assert expected["label"].any()  # the failures' approach is in the rows
    assert sorted(got) == sorted(expected)
    for key, column in expected.items():
        np.testing.assert_array_equal(got[key], column, err_msg=key)


@pytest.mark.slow
def test_the_rows_cache_key_of_a_split_table_follows_its_files(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    """A rolling archive grows in place: a day more is other data, though path and manifest stay."""
    _, split = dirs
    grown = tmp_path / "grown"
    shutil.copytree(split, grown, symlinks=True)
    features, config = FeatureConfig(cadence_s=TWIN.cadence_s), TrainConfig()
    before = world_rows_key(open_dataset(grown), features, config, 0)
    assert world_rows_key(open_dataset(grown), features, config, 0) == before
    shutil.copy(
        grown / "telemetry.parquet" / "2026-01-05.parquet", grown / "telemetry.parquet" / "2026-01-07.parquet"
    )
    assert world_rows_key(open_dataset(grown), features, config, 0) != before


@pytest.mark.slow
def test_visibility_separability_and_signals_read_split_tables_as_the_files(dirs: tuple[Path, Path]) -> None:
    file, split = dirs
    inputs = [*GPU_INPUTS, *NODE_INPUTS, SCRAPES_COLUMN, *SUMMARY_COLUMNS]
    seen = present_inputs(file, inputs)
    assert set(NODE_INPUTS) & seen  # the twin's network
    assert SCRAPES_COLUMN in seen  # and step summaries
    assert present_inputs(split, inputs) == seen
    assert report_rows(separability(open_dataset(split))) == report_rows(separability(open_dataset(file)))
    for network in (False, True):
        columns = ["net_rx_bytes"] if network else ["gpu_temp", "ecc_sbe_aggregate"]
        pd.testing.assert_frame_equal(
            read_telemetry(split, columns, [TWIN.node_name(1)], network=network),
            read_telemetry(file, columns, [TWIN.node_name(1)], network=network),
        )


@pytest.mark.slow
def test_score_command_reads_split_tables(
    dirs: tuple[Path, Path], stub_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file, split = dirs
    outputs = []
    for data in (file, split):
        assert cli.main(["score", "--model", str(stub_model), "--data", str(data)]) == 0
        outputs.append(capsys.readouterr().out.replace(str(data), "DATA"))
    assert outputs[1] == outputs[0]
    assert "what the model can see in DATA" in outputs[0]


# -- what is refused -----------------------------------------------------------------------------------


def _tiny(path: Path, hour: int, **extra: pa.Array) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    time = pa.array([pd.Timestamp(f"2026-01-05T{hour:02d}:00Z")], pa.timestamp("ns", tz="UTC"))
    pq.write_table(pa.table({"timestamp": time, "node": ["node-0000"], **extra}), path)


@pytest.mark.parametrize(
    ("other", "says"),
    [
        ({"gpu_temp": pa.array([60.0], pa.float32())}, "lacks gpu_temp_max"),
        ({"gpu_temp": pa.array([60.0], pa.float64()), "gpu_temp_max": [1.0]}, "gpu_temp float -> double"),
        ({"gpu_temp": pa.array([60.0], pa.float32()), "gpu_temp_max": [1.0], "extra": [1]}, "adds extra"),
    ],
)
def test_a_file_of_another_schema_is_a_data_error_naming_it(
    tmp_path: Path, other: dict[str, pa.Array], says: str
) -> None:
    table = tmp_path / "telemetry.parquet"
    _tiny(
        table / "2026-01-05" / "part-0.parquet",
        0,
        gpu_temp=pa.array([60.0], pa.float32()),
        gpu_temp_max=[1.0],
    )
    _tiny(table / "2026-01-05" / "part-1.parquet", 1, **other)
    with pytest.raises(DataError, match=rf"part-1\.parquet: its schema differs.*{re.escape(says)}"):
        ParquetParts(table)


@pytest.mark.slow
def test_replay_refuses_a_split_table_with_a_file_of_another_schema(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    _, split = dirs
    odd = tmp_path / "odd"
    shutil.copytree(split, odd, symlinks=True)
    _tiny(odd / "telemetry.parquet" / "2026-01-07.parquet", 0, gpu_temp=[1.0])
    with pytest.raises(DataError, match=r"2026-01-07\.parquet: its schema differs"):
        replay(open_dataset(odd), FeatureConfig(cadence_s=TWIN.cadence_s), lambda step: None)


@pytest.mark.parametrize(
    "make",
    [
        lambda table: table.mkdir(),
        lambda table: (table.mkdir(), (table / "README.txt").write_text("no table\n")),
        lambda table: (table.mkdir(), (table / ".2026-01-05.parquet").write_bytes(b"")),
        lambda table: (table / "2026-01-05").mkdir(parents=True),
    ],
    ids=["empty", "no parquet", "hidden only", "empty day folder"],
)
def test_a_directory_without_a_parquet_file_counts_as_missing(
    tmp_path: Path, make: Callable[[Path], object]
) -> None:
    for name in ("failures.csv", "manifest.json"):
        (tmp_path / name).write_text("")  # never read: the missing table is found first
    _tiny(tmp_path / "network.parquet" / "2026-01-05.parquet", 0, ib_symbol_error=[1.0])
    make(tmp_path / "telemetry.parquet")
    assert not table_exists(tmp_path / "telemetry.parquet")
    assert table_exists(tmp_path / "network.parquet")
    with pytest.raises(DataError, match=r"telemetry\.parquet is missing"):
        open_dataset(tmp_path)
    with pytest.raises(DataError, match="no Parquet file"):
        ParquetParts(tmp_path / "telemetry.parquet")
    assert present_inputs(tmp_path, ["gpu_temp", "ib_symbol_error"]) == {"ib_symbol_error"}
