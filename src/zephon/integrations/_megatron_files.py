"""Megatron-LM's data-loader rank files: find the generation to resume from and check it whole.

``save_dataloader_state`` writes ``iterable.save_state()`` of every data-parallel rank to
``<dir>/iter_<NNNNNNN>/mp_rank_00[_000]/train_dataloader_dprank<NNN>.pt`` as
``{"dataloader_state_dict": state}``; Megatron-Bridge's ``maybe_save_dataloader_state`` writes
the same content straight into ``<dir>/iter_<NNNNNNN>/``. Both layouts are read. zephon's state
in each file is the whole job's merged position with the job's DP size, so a generation is
complete when the files of ranks ``0 .. size-1`` are all there and carry the same, valid
checksum.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.checkpoints.format import CHECKSUM_KEY, verify_checksum
from zephon.errors import CheckpointError

log = logging.getLogger("zephon")

STATE_FORMAT = "zephon-megatron-dataloader"
_RANK_FILE = re.compile(r"train_dataloader_dprank(\d{3,})\.pt")
_GENERATION = re.compile(r"iter_(\d{7,})")
_LAYOUTS = ("train_dataloader_dprank*.pt", "mp_rank_*/train_dataloader_dprank*.pt")


def rank_file_name(dp_rank: int) -> str:
    return f"train_dataloader_dprank{dp_rank:03d}.pt"


@dataclass(frozen=True)
class Generation:
    """One iteration's rank files: ``files[rank]``, and why it cannot be resumed (or None)."""

    iteration: int
    directory: Path
    files: dict[int, Path]
    problem: str | None


def _read(path: Path) -> dict[str, Any]:
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: cannot read the data-loader rank file ({err})") from err
    state = saved.get("dataloader_state_dict") if isinstance(saved, dict) else None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise CheckpointError(
            f"{path}: not a zephon Megatron data-loader state; resume with the data provider "
            "that wrote it"
        )
    return state


def _problem(directory: Path, files: dict[int, Path]) -> str | None:
    """Why the generation's rank files do not form one whole job's state, or None."""
    if 0 not in files:
        if files:
            return f"{next(iter(files.values())).parent / rank_file_name(0)} is missing"
        return f"{directory} holds no {rank_file_name(0)} (nor its mp_rank_* folder)"
    size = int(_read(files[0])["dp_world_size"])
    missing = [rank for rank in range(size) if rank not in files]
    if missing:
        return (
            f"{files[0].parent / rank_file_name(missing[0])} is missing ({len(files)} of "
            f"{size} rank files)"
        )
    extra = sorted(set(files) - set(range(size)))
    if extra:
        return f"{files[extra[0]]} is one rank file too many: the job had {size} DP ranks"
    return None


def generation(directory: Path) -> Generation:
    """The rank files under one ``iter_*`` directory (either layout) and whether they are
    complete."""
    match = _GENERATION.fullmatch(directory.name)
    iteration = int(match.group(1)) if match else -1
    files: dict[int, Path] = {}
    twice = None
    for path in sorted(p for layout in _LAYOUTS for p in directory.glob(layout)):
        found = _RANK_FILE.fullmatch(path.name)
        if not found:
            continue
        rank = int(found.group(1))
        if rank in files and twice is None:
            twice = (
                f"{path} and {files[rank]} are both DP rank {rank}'s file; keep the one the "
                "job saved and remove the other"
            )
        files.setdefault(rank, path)
    return Generation(iteration, directory, files, twice or _problem(directory, files))


def _choose(save_dir: Path, iteration: int | None) -> Generation:
    if iteration is not None:
        found = generation(save_dir / f"iter_{iteration:07d}")
        if found.problem:
            raise CheckpointError(
                f"cannot resume the data at iteration {iteration}: {found.problem}; restore the "
                "file, or resume the model from an iteration whose rank files are all there"
            )
        return found
    generations = sorted(
        (generation(d) for d in save_dir.glob("iter_*") if _GENERATION.fullmatch(d.name)),
        key=lambda g: g.iteration,
        reverse=True,
    )
    for found in generations:
        if found.problem is None:
            return found
        log.warning(
            "data-loader state of iteration %d not used: %s", found.iteration, found.problem
        )
    detail = f": {generations[0].problem}" if generations else ""
    raise CheckpointError(
        f"{save_dir}: no complete generation of data-loader rank files{detail}; point "
        "dataloader_save at the directory the job saved into"
    )


def load_generation(
    save_dir: str | Path, iteration: int | None = None
) -> tuple[int, dict[str, Any]]:
    """``(iteration, merged pipeline checkpoint)`` of the newest complete generation under
    ``save_dir`` (or exactly ``iteration``'s), refused with the file at fault when incomplete,
    damaged, or when its rank files disagree."""
    chosen = _choose(Path(save_dir), iteration)
    states = {rank: _read(path) for rank, path in sorted(chosen.files.items())}
    sums = set()
    for rank, state in states.items():
        try:
            verify_checksum(state["state"])
        except CheckpointError as err:
            raise CheckpointError(f"{chosen.files[rank]}: {err}") from err
        sums.add(state["state"][CHECKSUM_KEY])
    if len(sums) != 1:
        raise CheckpointError(
            f"{chosen.directory}: the rank files hold different positions (checksums "
            f"{sorted(sums)}); they were not written by one save, resume from another iteration"
        )
    return chosen.iteration, states[0]["state"]
