"""A simulated multi-node Ray cluster (head + 3 labelled nodes, in their own driver process so
the session-wide local Ray is untouched): stages placed by resource label, byte-identical to
inline, actors reused between iterations, a node removed mid-run recovered exactly; a result
lost with its node (forced, not left to timing) computed again from its inputs; and busy nodes
removed again and again in one run (head + two nodes), costing no micro-batch a retry."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN_TIMEOUT_S = 600  # per run of the node-loss campaign (one takes 1-2 min when loaded)
# This checkout's source first (an installed zephon may be another checkout's), every node on
# 127.0.0.1.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.timeout(180)
def test_labelled_nodes_run_the_stages_and_a_lost_node_changes_nothing(hf_tokenizer_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runners._ray_cluster", str(hf_tokenizer_dir), "3000"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    nodes = out["nodes"]
    expected = out["inline"][:2]  # (digest of every batch's bytes, records)
    for run in ("first", "second", "after_removal", "after_death"):
        assert out[run][:2] == expected, run

    first = out["first_placement"]
    assert {node for _, node in first["fetch"]} == {nodes["io"]}
    for op in ("decode_text", "tokenize"):
        assert {node for _, node in first[op]} <= {nodes["cpu-a"], nodes["cpu-b"]}
    assert out["driver_node"] not in {node for actors in first.values() for _, node in actors}
    assert out["second_placement"] == first  # the same actors served the second iteration

    final = out["final_placement"]
    lost = nodes[out["removed"]]
    assert lost in {node for op in ("decode_text", "tokenize") for _, node in first[op]}
    assert lost not in {node for actors in final.values() for _, node in actors}
    assert {a for actors in final.values() for a, _ in actors} != {
        a for actors in first.values() for a, _ in actors
    }  # the actors of the lost node were replaced
    assert [pid for pid in out["pids"] if alive(pid)] == []  # the cluster is gone entirely


@pytest.mark.timeout(600)
def test_a_result_lost_with_its_node_is_computed_again_from_its_inputs():
    proc = subprocess.run(
        [sys.executable, "-m", "tests.runners._ray_object_lost"], cwd=ROOT,
        env=ENV, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["sealed_on_victim"]  # a result was in the lost node's store, never fetched
    causes = set(re.findall(r"(?:was lost|failed) \((\w+)[;)]", proc.stderr))
    assert causes & {"ObjectLostError", "ObjectReconstructionFailedError"}, proc.stderr[-4000:]
    assert out["got"] == out["expected"]


def node_loss_campaign(tok: Path, runs: int, removals: int, docs: int, retries: int):
    """Runs tests/runners/_ray_node_loss.py; its JSON line, and its stderr (the pool's log).
    Past ``CAMPAIGN_TIMEOUT_S`` a run, its whole process group goes (driver, GCS, raylets;
    workers follow their raylet), so no cluster outlives the test."""
    args = [str(tok), str(runs), str(removals), str(docs), str(retries)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runners._ray_node_loss", *args], cwd=ROOT, env=ENV,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=CAMPAIGN_TIMEOUT_S * runs)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the campaign ran past {CAMPAIGN_TIMEOUT_S * runs} s: {stderr[-4000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    out = json.loads(stdout.splitlines()[-1])
    assert [pid for pid in out["pids"] if alive(pid)] == []  # the cluster is gone entirely
    return out, stderr


def check_campaign(out: dict, runs: int, removals: int) -> None:
    assert len(out["runs"]) == runs
    for run in out["runs"]:
        assert run["error"] is None, run["error"]
        assert len(run["removals"]) == removals  # every removal landed before the run ended
        assert run["batches"] == out["batches"] and run["identical"], run


@pytest.mark.timeout(CAMPAIGN_TIMEOUT_S + 120)
def test_busy_nodes_removed_again_and_again_cost_no_retry_and_change_nothing(hf_tokenizer_dir):
    """max_worker_retries=0: a node loss charged to a micro-batch would end the run."""
    out, log = node_loss_campaign(hf_tokenizer_dir, runs=1, removals=4, docs=2000, retries=0)
    check_campaign(out, runs=1, removals=4)
    # Each removal took the node where its stop record waited: that micro-batch was lost with
    # it and run again on a live actor, free of the (zero) retry budget.
    again = re.findall(r"node \S+ was lost \(\w+\); running the micro-batch again", log)
    assert len(again) >= 4, log[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(CAMPAIGN_TIMEOUT_S * 10 + 120)
def test_ten_runs_each_losing_six_busy_nodes_all_equal_inline(hf_tokenizer_dir):
    out, _ = node_loss_campaign(hf_tokenizer_dir, runs=10, removals=6, docs=3000, retries=3)
    check_campaign(out, runs=10, removals=6)
