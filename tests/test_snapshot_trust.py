"""Nothing a snapshot file or a peer sends is unpickled unless the job signed it, or as plain data.

- The job's key (client/job_key.py): created once in the store, mode 0600, by whichever of several
  racing processes comes first; refused when it is a link, another user's, or readable by others.
- The per-rank part (client/rank_part.py): signed, it is unpickled only once it verifies; changed,
  moved to another rank or signed by another job, it is refused; unsigned (an older faultcast's),
  it is unpickled as plain data only, and a global outside the allowlist is refused by name.
- Through Protection and real torch.distributed.checkpoint files: a snapshot whose per-rank part,
  `.metadata` or another value names code is refused before that code runs (each of these ran it
  before: the marker file the code would create is the witness); an older faultcast's snapshot
  still resumes exactly; another job's snapshot does not verify here.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from faultcast.client import job_key, rank_part, restricted_pickle, snapshot_reader
from faultcast.client.protection import Protection
from faultcast.client.sampler import ResumableDistributedSampler
from faultcast.client.snapshots import SnapshotStore
from faultcast.client.train_state import RANK_KEY, TrainState, capture_rng
from tests.torch_parts import filled_linear, global_rng_kept

pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)
PART = RANK_KEY.format(rank=0)


class _Touch:
    """A pickle that, unpickled without restriction, creates `witness`: code of someone else's choosing."""

    def __init__(self, witness: Path) -> None:
        self.witness = witness

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.witness,))


@pytest.fixture(autouse=True)
def _global_rng() -> Iterator[None]:
    with global_rng_kept():
        yield


# -- the job's key -----------------------------------------------------------------------------------

_RACER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from faultcast.client.job_key import job_key

    print("ready", flush=True)
    sys.stdin.readline()  # all start together
    print(job_key(Path(sys.argv[1])).hex(), flush=True)
    """
)


def test_racing_processes_create_one_key_and_all_read_it(tmp_path: Path) -> None:
    root = tmp_path / "store" / "not-yet-made"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None
            assert racer.stdout.readline() == "ready\n"
        for racer in racers:
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        keys = {racer.communicate(timeout=60)[0].strip() for racer in racers}
    finally:
        for racer in racers:
            racer.kill()
    assert all(racer.returncode == 0 for racer in racers)
    (key,) = keys
    assert bytes.fromhex(key) == job_key.job_key(root)
    assert len(bytes.fromhex(key)) == job_key.KEY_BYTES
    assert [p.name for p in root.iterdir()] == [job_key.KEY_FILE]  # no temporary file left behind
    assert (root / job_key.KEY_FILE).stat().st_mode & 0o777 == 0o600


def test_a_key_file_that_is_not_the_jobs_own_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "known-key"
    elsewhere.write_bytes(bytes(job_key.KEY_BYTES))
    elsewhere.chmod(0o600)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / job_key.KEY_FILE).symlink_to(elsewhere)
    with pytest.raises(job_key.JobKeyError, match="cannot be opened as a plain file"):
        job_key.job_key(linked)

    shared = tmp_path / "shared"
    job_key.job_key(shared)
    (shared / job_key.KEY_FILE).chmod(0o644)
    with pytest.raises(job_key.JobKeyError, match="mode 0644: others may read"):
        job_key.job_key(shared)

    short = tmp_path / "short"
    short.mkdir()
    (short / job_key.KEY_FILE).write_bytes(b"abc")
    (short / job_key.KEY_FILE).chmod(0o600)
    with pytest.raises(job_key.JobKeyError, match="holds 3 bytes"):
        job_key.job_key(short)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    job_key.job_key(tmp_path)
    os.chown(tmp_path / job_key.KEY_FILE, 4321, -1)
    with pytest.raises(job_key.JobKeyError, match="belongs to uid 4321"):
        job_key.job_key(tmp_path)


# -- the per-rank part -------------------------------------------------------------------------------

KEY, OTHER_KEY = bytes(range(32)), bytes(range(1, 33))


def test_a_signed_part_comes_back_and_any_change_is_refused_before_unpickling(tmp_path: Path) -> None:
    rng = capture_rng()
    part = {"step": 7, "rng": rng, "stateful": {"data": {"epoch": 1, "offset": 8}}}
    sealed = rank_part.seal(part, KEY, PART)
    back = rank_part.unseal(sealed, KEY, PART)
    assert isinstance(back, dict)
    assert back["step"] == 7
    assert torch.equal(back["rng"]["torch"], rng["torch"])

    changed = bytearray(sealed)
    changed[-5] ^= 1
    with pytest.raises(rank_part.RankPartError, match="does not verify with the job's key"):
        rank_part.unseal(bytes(changed), KEY, PART)
    with pytest.raises(rank_part.RankPartError, match="does not verify"):
        rank_part.unseal(sealed, KEY, RANK_KEY.format(rank=1))  # rank 0's part in rank 1's place
    with pytest.raises(rank_part.RankPartError, match="does not verify"):
        rank_part.unseal(sealed, OTHER_KEY, PART)  # another job's

    # A forger without the key signs code with a key of their own: refused, and it never runs.
    witness = tmp_path / "ran"
    forged = rank_part.seal(_Touch(witness), OTHER_KEY, PART)
    with pytest.raises(rank_part.RankPartError, match="does not verify"):
        rank_part.unseal(forged, KEY, PART)
    assert not witness.exists()


def test_an_unsigned_part_is_unpickled_as_plain_data_only(tmp_path: Path) -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    sampler = ResumableDistributedSampler(range(10), num_replicas=1, rank=0)
    # What an older faultcast wrote: the part pickled as is (protocol 2 as well: __builtin__ names).
    rng = capture_rng()
    numpy_state = rng["numpy"]
    assert isinstance(numpy_state, tuple)  # the legacy form: ("MT19937", keys, pos, has_gauss, gauss)
    stateful = {"scheduler": scheduler.state_dict(), "data": sampler.state_dict()}
    odd = [{1, 2}, frozenset({3}), 1 + 2j, np.float64(0.5), torch.Size([2, 3]), torch.float16]
    part = {"step": 20, "rng": rng, "stateful": stateful, "odd": odd}
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = rank_part.unseal(pickle.dumps(part, protocol=protocol), KEY, PART)
        assert isinstance(back, dict)
        assert back["stateful"] == stateful
        assert back["odd"] == odd
        assert back["rng"]["python"] == rng["python"]
        assert np.array_equal(back["rng"]["numpy"][1], numpy_state[1])
        assert torch.equal(back["rng"]["torch"], rng["torch"])

    witness = tmp_path / "ran"
    with pytest.raises(rank_part.RankPartError, match=r"names the global pathlib\.Path\.touch"):
        rank_part.unseal(pickle.dumps({"step": 1, "rng": _Touch(witness)}), KEY, PART)
    assert not witness.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4:UserWarning")  # the forged storage's bytes
def test_a_pickled_tensor_storage_is_read_with_torchs_own_restrictions(tmp_path: Path) -> None:
    # A plain pickle of a tensor names torch.storage._load_from_bytes, which runs torch.load with
    # weights_only=False on bytes of the pickle's choosing: here those bytes name code.
    witness = tmp_path / "ran"
    from torch.storage import _load_from_bytes

    class _Storage:
        def __reduce__(self) -> tuple[object, tuple[object, ...]]:
            return (_load_from_bytes, (pickle.dumps(_Touch(witness)),))

    with pytest.raises(rank_part.RankPartError, match="refused"):
        rank_part.unseal(pickle.dumps({"rng": _Storage()}), KEY, PART)
    assert not witness.exists()


def test_the_restricted_unpickler_names_the_refused_global() -> None:
    with pytest.raises(
        restricted_pickle.RefusedPickleError, match=r"the thing names the global builtins\.eval"
    ):
        restricted_pickle.loads(pickle.dumps(eval), restricted_pickle.RANK_PART, "the thing")


# -- through Protection and torch.distributed.checkpoint's files --------------------------------------


def _model(value: float) -> torch.nn.Linear:
    return filled_linear(value)


def _write(directory: Path, step: int, state: dict[str, object]) -> Path:
    """A whole snapshot of `step` holding `state`, written with DCP and marked as rank 0 marks it."""
    store = SnapshotStore(directory)
    path = store.prepare(step, 0, None)
    dcp_save(state, checkpoint_id=path, no_dist=True)
    assert store.finish(step, 0, "periodic", 1) is not None
    return path


def _resume(directory: Path, value: float = 0.0) -> tuple[Protection, torch.nn.Linear, int]:
    model = _model(value)
    protection = Protection(directory, TrainState(model=model))
    return protection, model, protection.resume()


def test_protection_signs_its_parts_with_the_stores_key_and_resumes_from_them(tmp_path: Path) -> None:
    writer = Protection(tmp_path, TrainState(model=_model(2.0)), checkpoint_every=5, agree_every=5)
    writer.step_end(5)
    writer.close()
    key_file = tmp_path / job_key.KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    protection, model, step = _resume(tmp_path)
    protection.close()
    assert step == 5
    assert torch.equal(model.weight, torch.full((2, 3), 2.0))


def test_an_older_faultcasts_unsigned_snapshot_still_resumes_exactly(tmp_path: Path) -> None:
    torch.manual_seed(11)
    rng = capture_rng()
    expected = torch.rand(4)  # what the generator gives right after the snapshot
    legacy: dict[str, object] = {
        "model": _model(3.0).state_dict(),
        PART: pickle.dumps({"step": 30, "rng": rng, "stateful": {}}),
    }
    _write(tmp_path, 30, legacy)
    torch.manual_seed(99)
    protection, model, step = _resume(tmp_path)
    protection.close()
    assert step == 30
    assert torch.equal(model.weight, torch.full((2, 3), 3.0))
    assert torch.equal(torch.rand(4), expected)


def test_a_part_naming_code_is_refused_and_the_code_never_runs(tmp_path: Path) -> None:
    witness = tmp_path / "ran"
    _write(
        tmp_path / "store",
        10,
        {"model": _model(1.0).state_dict(), PART: pickle.dumps({"step": _Touch(witness)})},
    )
    with pytest.raises(rank_part.RankPartError, match=r"pathlib\.Path\.touch"):
        _resume(tmp_path / "store")
    assert not witness.exists()


def test_a_value_naming_code_is_refused_by_the_snapshot_reader(tmp_path: Path) -> None:
    # DCP saves a non-tensor value with torch.save and loaded it with weights_only=False.
    witness = tmp_path / "ran"
    _write(tmp_path / "store", 10, {"model": _model(1.0).state_dict(), PART: _Touch(witness)})
    with pytest.raises(snapshot_reader.SnapshotReadError, match=f"value {PART} is not plain data"):
        _resume(tmp_path / "store")
    assert not witness.exists()


def test_metadata_naming_code_is_refused_and_the_code_never_runs(tmp_path: Path) -> None:
    # DCP unpickled `.metadata` with pickle.load.
    witness = tmp_path / "ran"
    path = _write(tmp_path / "store", 10, {"model": _model(1.0).state_dict(), PART: pickle.dumps({})})
    (path / ".metadata").write_bytes(pickle.dumps(_Touch(witness)))
    with pytest.raises(snapshot_reader.SnapshotReadError, match=r"names the global pathlib\.Path\.touch"):
        _resume(tmp_path / "store")
    assert not witness.exists()


def test_another_jobs_signed_snapshot_does_not_verify_here(tmp_path: Path) -> None:
    other = tmp_path / "other-job"
    writer = Protection(other, TrainState(model=_model(5.0)), checkpoint_every=5, agree_every=5)
    writer.step_end(5)
    writer.close()
    mine = tmp_path / "my-job"
    job_key.job_key(mine)  # this job has a key of its own
    shutil.copytree(other / "step-000000005", mine / "step-000000005")
    with pytest.raises(rank_part.RankPartError, match="does not verify with the job's key"):
        _resume(mine)
