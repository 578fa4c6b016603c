"""The HTTP gateway (verifier/http/gateway.py) for real: a server with ``http_port=0`` on
loopback and the real nsjail sandbox, called by the trainers' own client code, plus bad input,
limits, token, TLS and the drain.

The real clients are the released wheels, installed by scripts/setup.sh with ``pip install
--no-deps --target .venv/client-packages/<dist>-<version>`` (their torch/ray/vllm pins conflict
with ours): verl 0.9.1 ``verl/utils/reward_score/sandbox_fusion`` (``compute_score``,
``check_correctness``, ``call_sandbox_api``), OpenRLHF 0.8.2 ``openrlhf/utils/remote_rm_utils.py``
(``remote_rm_fn``, ``request_api_wrapper`` with ``score_key``), 0.9.0's ``request_api_wrapper``
(the whole answer) and 0.11.2 ``openrlhf/utils/agent.py``
(``SingleTurnAgentExecutor._fetch_rewards_via_http``). ``client_module`` imports just those
modules from the wheel's files: their packages' ``__init__`` files (which import torch, ray,
vllm, tensordict, transformers) are replaced by bare package objects pointing at the same
directories, and ``ray``, imported by remote_rm_utils.py only for its ``@ray.remote`` wrappers
that no test calls, by a stub when ray is not installed. Everything the tested functions run
is the wheels' own code (requests, aiohttp, torch from our venv).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import importlib.util
import json
import socket
import sys
import threading
import time
import types
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import tyro

from tests.certs import make_pki
from tests.conftest import ROOT, ServerProcess
from tests.conftest_sandbox import (
    WARM_SANDBOXES,
    assert_no_leftovers,
    refuse_sandbox,
    sandbox_pids,
)
from verifier.scoring.scorer import ScoringConfig
from verifier.service.server import ServeConfig, create_server

CLIENTS = ROOT / ".venv" / "client-packages"
TOKEN = "http-gateway-test-token"
SUM = "a, b = map(int, input().split())\nprint(a + b)"
SUM_TESTS = {"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7\n", "30\n"]}
PROMPT = "<|im_start|>user\nAdd the two numbers on stdin.<|im_end|>\n<|im_start|>assistant\n"


# -- the real clients ----------------------------------------------------------------------------
@contextlib.contextmanager
def client_module(dist: str, dotted: str, stub_ray: bool = False) -> Iterator[types.ModuleType]:
    """``dotted`` imported from the wheel installed alone under .venv/client-packages/<dist>
    (module docstring), with ``sys.modules`` restored afterwards."""
    root = CLIENTS / dist
    if not root.is_dir():
        pytest.skip(f"{root} is missing: scripts/setup.sh (make setup) installs the clients")
    parts = dotted.split(".")
    top = parts[0]
    mine = lambda name: name == top or name.startswith(top + ".")  # noqa: E731
    saved = {k: v for k, v in sys.modules.items() if mine(k)}
    for k in saved:
        del sys.modules[k]
    stubbed = []
    if stub_ray and "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
        ray = types.ModuleType("ray")
        ray.remote = lambda fn=None, **_kw: fn  # type: ignore[attr-defined]
        sys.modules["ray"] = ray
        stubbed.append("ray")
    try:
        for i in range(1, len(parts)):
            pkg = types.ModuleType(".".join(parts[:i]))
            pkg.__path__ = [str(root.joinpath(*parts[:i]))]
            sys.modules[pkg.__name__] = pkg
        yield importlib.import_module(dotted)
    finally:
        for k in [k for k in sys.modules if mine(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        for k in stubbed:
            sys.modules.pop(k, None)


@pytest.fixture(scope="module")
def verl_sf() -> Iterator[types.ModuleType]:
    with client_module("verl-0.9.1", "verl.utils.reward_score.sandbox_fusion") as m:
        yield m


# -- servers -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[object, str]]:
    """A real server with the gateway on a free port: 2 workers, nsjail, 1 s body timeout, and
    an 8 MiB body limit (the default is 100 MiB; a smaller one keeps the chunked test fast)."""
    srv, _ = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=2), http_port=0, request_timeout_s=1.0,
        http_max_body_mb=8))
    # Its jails that wait for the next /run_code call are not leftovers (conftest_sandbox).
    WARM_SANDBOXES.append(srv.scorer.sandbox)
    yield srv, f"http://127.0.0.1:{srv.http_port}"
    WARM_SANDBOXES.remove(srv.scorer.sandbox)
    srv.stop(grace_s=1.0)


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[tuple[str, object]]:
    """TLS and a token, and no working sandbox (its self-test fails on purpose)."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    token_file = tmp_path_factory.mktemp("tok") / "token"
    token_file.write_text(TOKEN + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("verifier.scoring.scorer.create_sandbox", refuse_sandbox("no sandbox in this test"))
        srv, _ = create_server("127.0.0.1:0", ServeConfig(
            scoring=ScoringConfig(workers=1), http_port=0, tls_cert=pki.server_cert,
            tls_key=pki.server_key, token_file=token_file))
    yield f"https://127.0.0.1:{srv.http_port}", pki
    srv.stop(grace_s=1.0)


def run_code(url: str, code: str, **fields) -> requests.Response:
    return requests.post(f"{url}/run_code", json={"language": "python", "code": code, **fields},
                         timeout=30)


def fenced(code: str) -> str:
    return f"<think>easy</think>\n```python\n{code}\n```"


# -- SandboxFusion's /run_code -------------------------------------------------------------------
def test_run_code_answers_as_sandboxfusion(gateway) -> None:
    _, url = gateway
    data = base64.b64encode(b"41\n").decode()
    cases = {
        "ok": ({"code": "print(input()[::-1])", "stdin": "abc"}, "Success", "Finished", 0),
        "exit": ({"code": "import sys; print('x'); sys.exit(3)"}, "Failed", "Finished", 3),
        "raise": ({"code": "1 / 0"}, "Failed", "Finished", 1),
        "tle": ({"code": "while True: pass", "run_timeout": 1}, "Failed", "TimeLimitExceeded",
                None),
        "files": ({"code": "import os\nn = int(open('data/in.txt').read())\n"
                           "open('out.txt', 'w').write('x')\nprint(n + 1, os.getcwd())",
                   "files": {"data/in.txt": data, "skipped.txt": None}},
                  "Success", "Finished", 0),
        "memory": ({"code": "x = bytearray(512 * 1024 * 1024)", "memory_limit_MB": 128},
                   "Failed", "Finished", "nonzero"),
        "no_stdin": ({"code": "import sys; print(repr(sys.stdin.read()))", "stdin": None,
                      "compile_timeout": 1}, "Success", "Finished", 0),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        got = dict(zip(cases, pool.map(lambda c: run_code(url, **c[0]), cases.values())))
    for name, (_, status, run_status, rc) in cases.items():
        r = got[name]
        assert r.status_code == 200, (name, r.text)
        body = r.json()
        assert set(body) == {"status", "message", "compile_result", "run_result",
                             "executor_pod_name", "files"}, name
        run = body["run_result"]
        assert set(run) == {"status", "execution_time", "return_code", "stdout", "stderr"}
        assert (body["status"], run["status"]) == (status, run_status), (name, body)
        assert run["return_code"] != 0 if rc == "nonzero" else run["return_code"] == rc, name
        assert body["compile_result"] is None and body["files"] == {}
        assert isinstance(run["execution_time"], float)
    assert got["ok"].json()["run_result"]["stdout"] == "cba\n"
    assert "ZeroDivisionError" in got["raise"].json()["run_result"]["stderr"]
    assert got["tle"].json()["run_result"]["execution_time"] >= 1.0
    assert got["files"].json()["run_result"]["stdout"] == "42 /tmp\n"
    assert got["no_stdin"].json()["run_result"]["stdout"] == "''\n"


def test_run_code_is_isolated(gateway) -> None:
    """The side-by-side's isolation probes: the host's /etc/passwd and /tmp are out of reach,
    and nothing the program starts outlives its answer."""
    _, url = gateway
    marker = f"gateway-probe-{uuid.uuid4().hex}"
    baseline = sandbox_pids()
    probe = ("import os, subprocess\n"
             "print(os.path.exists('/etc/passwd'))\n"
             f"open('/tmp/{marker}', 'w').write('x')\n"
             "subprocess.Popen(['sleep', '60'])\n"
             "if os.fork() == 0:\n    os.setsid(); import time; time.sleep(60)\n")
    body = run_code(url, probe).json()
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"].splitlines()[0] == "False"
    assert not Path("/tmp", marker).exists()
    assert_no_leftovers(baseline)


@pytest.mark.parametrize("fields, status, words", [
    ({"language": "cpp"}, 400, "'cpp' is not supported"),
    ({"language": None}, 400, "None is not supported"),
    ({"code": None}, 400, "'code' must be a string"),
    ({"stdin": ["1"]}, 400, "'stdin' must be a string"),
    ({"run_timeout": "10"}, 400, "'run_timeout' must be a number"),
    ({"run_timeout": 0}, 400, "must be > 0"),
    ({"run_timeout": 10_000}, 400, "maximum of 300"),
    ({"compile_timeout": True}, 400, "'compile_timeout' must be a number"),
    ({"memory_limit_MB": 1.5}, 400, "must be an integer"),
    ({"memory_limit_MB": 4}, 400, "between 32"),
    ({"memory_limit_MB": 10**6}, 400, "maximum of 4096"),
    ({"files": ["a"]}, 400, "'files' must be an object"),
    ({"files": {"a.txt": "%%%"}}, 400, "not valid base64"),
    ({"files": {"/etc/x": ""}}, 400, "must be relative"),
    ({"files": {"a/../../x": ""}}, 400, "must be relative"),
    ({"fetch_files": ["out.txt"]}, 400, "'fetch_files' is not supported"),
])
def test_run_code_refuses_what_it_cannot_do(gateway, fields, status, words) -> None:
    _, url = gateway
    r = requests.post(f"{url}/run_code", json={"language": "python", "code": "print(1)", **fields},
                      timeout=10)
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.json()


# -- verl's SandboxFusion client -------------------------------------------------------------------
def test_verl_compute_score_through_the_gateway(gateway, verl_sf) -> None:
    _, url = gateway
    run_url = f"{url}/run_code"
    right, meta = verl_sf.compute_score(run_url, None, 1024, fenced(SUM), SUM_TESTS)
    assert right == 1.0 and [m["status"] for m in meta] == ["success"] * 3
    wrong, meta = verl_sf.compute_score(run_url, None, 1024, fenced("print(0)"), SUM_TESTS)
    assert wrong == 0.0 and [m["status"] for m in meta] == ["wrong_answer"] * 3
    call = {"fn_name": "add", "inputs": ["1\n2", "3\n4"], "outputs": ["3", "7"]}
    func = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert verl_sf.compute_score(run_url, None, 1024, fenced(func), call)[0] == 1.0
    asserts = {"assert_case": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    score, meta = verl_sf.compute_score(run_url, None, 1024, fenced("def add(a, b):\n"
                                                                    "    return a + b"), asserts)
    assert score == 0.5 and [m["status"] for m in meta] == ["success", "runtime_error"]


def test_verl_check_correctness_error_codes(gateway, verl_sf) -> None:
    """verl's codes: True, False, -2 runtime error, -3 time limit; -1 for an API error."""
    _, url = gateway
    code = ("s = input()\nif s == 'loop':\n    while True: pass\n"
            "if s == 'boom':\n    raise ValueError(s)\nprint(s)")
    tests = {"inputs": ["ok\n", "no\n", "boom\n", "loop\n"], "outputs": ["ok", "yes", "", ""]}
    results, _ = verl_sf.utils.check_correctness(f"{url}/run_code", tests, code, timeout=1)
    assert results == [True, False, -2, -3]
    body, error = verl_sf.utils.call_sandbox_api(f"{url}/run_code", "int main() {}", None, 1, 1,
                                                 1024, "cpp")
    assert body is None and "400" in error


# -- OpenRLHF's remote reward ----------------------------------------------------------------------
def reward_batch() -> tuple[list[str], list[str], list]:
    """Two math and two code queries (prompt + response), each a right and a wrong answer."""
    math_prompt = "What is 6 * 7? Put the answer in \\boxed{}.\n"
    responses = ["<think>6*7</think> \\boxed{42}<|im_end|>", "\\boxed{41}<|im_end|>",
                 fenced(SUM) + "<|im_end|>", fenced("print(1)") + "<|im_end|>"]
    prompts = [math_prompt, math_prompt, PROMPT, PROMPT]
    labels = ["42", "42", json.dumps(SUM_TESTS), SUM_TESTS]
    return [p + r for p, r in zip(prompts, responses)], prompts, labels


def test_openrlhf_0_8_remote_rm_fn(gateway) -> None:
    _, url = gateway
    queries, prompts, labels = reward_batch()
    with client_module("openrlhf-0.8.2", "openrlhf.utils.remote_rm_utils", stub_ray=True) as rm:
        rewards = rm.remote_rm_fn(f"{url}/get_reward", queries, prompts, labels)
        scores = rm.request_api_wrapper(f"{url}/get_reward",
                                        {"query": queries, "prompts": prompts, "labels": labels},
                                        score_key="scores")
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert scores == [1.0, 0.0, 1.0, 0.0]


def test_openrlhf_0_9_request_api_wrapper(gateway) -> None:
    _, url = gateway
    queries, prompts, labels = reward_batch()
    with client_module("openrlhf-0.9.0", "openrlhf.utils.remote_rm_utils", stub_ray=True) as rm:
        info = rm.request_api_wrapper(f"{url}/get_reward",
                                      {"query": queries, "prompts": prompts, "labels": labels})
    assert info["rewards"] == info["scores"] == [1.0, 0.0, 1.0, 0.0]
    # update_samples_with_rewards concatenates every extra_logs value as a tensor
    assert info["extra_logs"] == {"verifier_correct": [1.0, 0.0, 1.0, 0.0]}
    assert [r["status"] for r in info["results"]] == ["CORRECT", "INCORRECT"] * 2


def test_openrlhf_0_11_agent_executor(gateway) -> None:
    _, url = gateway
    queries, prompts, labels = reward_batch()
    with client_module("openrlhf-0.11.2", "openrlhf.utils.agent") as agent:
        executor = agent.SingleTurnAgentExecutor(f"{url}/get_reward")

        async def one_per_request() -> list:  # as execute() calls it: one query per request
            return await asyncio.gather(*(executor._fetch_rewards_via_http([q], [p], [lab])
                                          for q, p, lab in zip(queries, prompts, labels)))

        answers = [a[0] for a in asyncio.run(one_per_request())]
    assert [a["rewards"] for a in answers] == [[1.0], [0.0], [1.0], [0.0]]
    assert [a["scores"] for a in answers] == [[1.0], [0.0], [1.0], [0.0]]


def test_get_reward_rules(gateway) -> None:
    _, url = gateway
    post = lambda body: requests.post(f"{url}/get_reward", json=body, timeout=30)  # noqa: E731
    # the prompt is cut off: its boxed example is not the response's answer
    prompt = "Example: \\boxed{7}. Now: what is 3 + 4?\n"
    r = post({"query": ["<s>" + prompt + "I do not know."], "prompts": [prompt], "labels": ["7"]})
    assert r.json()["rewards"] == [0.0] and r.json()["results"][0]["status"] == "NO_ANSWER"
    # a label that is an item of its own; no prompts at all
    env = {"ground_truth": SUM_TESTS, "limits": {"reward_mode": "fractional"},
           "data_source": "lcb"}
    r = post({"query": [fenced("print(3)")], "labels": [env]})
    assert r.json()["rewards"] == [pytest.approx(1 / 3)]
    assert r.json()["results"][0]["data_source"] == "lcb"
    # a label that cannot be judged: no reward, the whole request is refused, naming it
    r = post({"query": ["x", fenced(SUM)], "prompts": ["", ""], "labels": ["1", {"inputs": 3}]})
    assert r.status_code == 422 and "query 1: INVALID_INPUT" in r.json()["message"]
    for body, words in [({"query": "x", "labels": ["1"]}, "'query' must be a list"),
                        ({"query": ["x"], "labels": ["1", "2"]}, "'labels' has 2 entries"),
                        ({"query": ["x"], "prompts": [1], "labels": ["1"]}, "prompt 0 must be")]:
        r = post(body)
        assert r.status_code in (400, 422) and words in r.json()["message"], r.json()


def test_score_takes_our_items(gateway) -> None:
    _, url = gateway
    items = [{"id": "m", "domain": "math", "response": "\\boxed{2}", "ground_truth": "2"},
             {"id": "c", "domain": "code", "response": fenced(SUM), "ground_truth": SUM_TESTS},
             {"id": "bad", "domain": "chess", "response": "e4", "ground_truth": "e4"}]
    r = requests.post(f"{url}/score", json={"items": items}, timeout=30)
    assert [(x["id"], x["status"]) for x in r.json()["results"]] == [
        ("m", "CORRECT"), ("c", "CORRECT"), ("bad", "INVALID_INPUT")]
    r = requests.post(f"{url}/score", json=items, timeout=10)
    assert r.status_code == 400 and '{"items"' in r.json()["message"]
    r = requests.post(f"{url}/score", json={"items": [{}] * 4097}, timeout=10)
    assert r.status_code == 413 and "limit of 4096" in r.json()["message"]


# -- bad input, while the rest goes on -------------------------------------------------------------
def raw(port: int, head: str, body: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head.encode() + b"\r\n\r\n" + body)
    return s


def answer(s: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
            data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def test_bad_bodies_get_clear_4xx(gateway) -> None:
    srv, url = gateway
    port = srv.http_port
    cases = [(b"{not json", 400, "not valid JSON"), (b"", 400, "no body"),
             (b"[" * 100_000, 400, "nested too deeply"), (b"\xff\xfe\x00", 400, "not valid JSON"),
             (b'"just a string"', 400, "must be a JSON object")]
    for body, status, words in cases:
        r = requests.post(f"{url}/get_reward", data=body, timeout=10)
        assert r.status_code == status and words in r.json()["message"], (body[:10], r.text)
    # a declared 100 MiB body: refused on its headers, nothing of it read
    s = raw(port, "POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {100 * 1024 * 1024 + 1}")
    status, body = answer(s)
    assert status == 413 and "over this server's limit of 8 MiB" in body["message"]
    assert s.recv(1) == b""  # and the connection is closed
    # a chunked body that passes the limit while it is read
    s = raw(port, "POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked",
            b"".join(b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n" for _ in range(9)))
    assert answer(s)[0] == 413


def test_slow_clients_hold_nothing(gateway) -> None:
    """A body that stalls gets 408 after --request-timeout-s; headers that never end hold a
    connection only; meanwhile other requests are served at once."""
    srv, url = gateway
    slow_body = raw(srv.http_port, "POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: 1000",
                    b'{"query": [')
    slow_head = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
    slow_head.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    queries, prompts, labels = reward_batch()
    t0 = time.monotonic()
    r = requests.post(f"{url}/get_reward", timeout=10,
                      json={"query": queries[:2], "prompts": prompts[:2], "labels": labels[:2]})
    assert r.json()["rewards"] == [1.0, 0.0] and time.monotonic() - t0 < 0.9
    status, body = answer(slow_body)
    assert status == 408 and "within 1 s" in body["message"]
    assert time.monotonic() - t0 >= 0.9
    slow_head.close()


def test_a_client_that_leaves_takes_its_queued_items(gateway) -> None:
    srv, _ = gateway
    depth = lambda: srv.metrics.registry.get_sample_value(  # noqa: E731
        "verifier_queue_depth", {"domain": "code"})
    slow = {"id": "s", "domain": "code", "response": fenced("import time; time.sleep(1.5)"),
            "ground_truth": {"inputs": [""], "outputs": [""]}}
    body = json.dumps({"items": [slow] * 8}).encode()
    s = raw(srv.http_port, f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}",
            body)
    deadline = time.monotonic() + 10
    while depth() < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert depth() == 8
    s.close()
    time.sleep(0.5)
    assert depth() <= 2  # the queued six are gone; the two running end with their jails
    while depth() > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert depth() == 0


def test_metrics_count_http_requests(gateway) -> None:
    srv, url = gateway
    requests.post(f"{url}/run_code", json={"language": "go", "code": ""}, timeout=10)
    assert run_code(url, "print(1)").status_code == 200
    item = {"id": "c", "domain": "code", "response": fenced(SUM), "ground_truth": SUM_TESTS}
    assert requests.post(f"{url}/score", json={"items": [item]}, timeout=30).status_code == 200
    value = srv.metrics.registry.get_sample_value
    assert value("verifier_requests_total", {"method": "POST /run_code", "code": "200"}) >= 1
    assert value("verifier_requests_total", {"method": "POST /run_code", "code": "400"}) >= 1
    assert value("verifier_items_total", {"domain": "code", "status": "CORRECT"}) >= 1


# -- token, TLS, no sandbox ----------------------------------------------------------------------
def test_token_tls_and_no_sandbox(secure) -> None:
    url, pki = secure
    ca = str(pki.ca)
    body = {"query": ["\\boxed{2}"], "labels": ["2"]}
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(url.replace("https", "http") + "/get_reward", json=body, timeout=10)
    r = requests.post(f"{url}/get_reward", json=body, verify=ca, timeout=10)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    r = requests.post(f"{url}/get_reward", json=body, verify=ca, timeout=10,
                      headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["message"] == "invalid bearer token"
    r = requests.post(f"{url}/get_reward", json=body, verify=ca, timeout=10,
                      headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.json()["rewards"] == [1.0]
    # clients that cannot send headers (verl, OpenRLHF) put it in the URL (RFC 6750 2.3)
    r = requests.post(f"{url}/get_reward?access_token={TOKEN}", json=body, verify=ca, timeout=10)
    assert r.json()["rewards"] == [1.0]
    assert requests.get(f"{url}/health", verify=ca, timeout=10).json() == {"status": "SERVING"}
    # no sandbox: a run is SandboxFusion's SandboxError; a code reward is not a 0 but a 503
    r = requests.post(f"{url}/run_code?access_token={TOKEN}", verify=ca, timeout=10,
                      json={"language": "python", "code": "print(1)"})
    assert r.json()["status"] == "SandboxError" and "no sandbox" in r.json()["message"]
    r = requests.post(f"{url}/get_reward?access_token={TOKEN}", verify=ca, timeout=10,
                      json={"query": [fenced(SUM)], "labels": [SUM_TESTS]})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert "SANDBOX_ERROR" in r.json()["message"]


# -- limits and the drain ------------------------------------------------------------------------
def test_request_limit_and_drain() -> None:
    srv, _ = create_server("127.0.0.1:0", ServeConfig(
        scoring=ScoringConfig(workers=1), http_port=0, http_max_requests=1))
    url = f"http://127.0.0.1:{srv.http_port}"
    session = requests.Session()
    assert session.get(f"{url}/health", timeout=10).status_code == 200  # a kept-alive connection
    slow: dict = {}
    worker = threading.Thread(target=lambda: slow.update(r=run_code(
        url, "import time; time.sleep(1.5); print('done')")))
    worker.start()
    deadline = time.monotonic() + 10
    while srv.http_gateway._inflight < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    r = requests.post(f"{url}/score", json={"items": []}, timeout=10)
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    stopper = threading.Thread(target=srv.stop, kwargs={"grace_s": 10.0})
    stopper.start()
    while requests.get(f"{url}/health", timeout=5).status_code == 200:  # until it drains
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert session.get(f"{url}/health", timeout=5).json() == {"status": "NOT_SERVING"}
    r = requests.post(f"{url}/get_reward", json={"query": ["1"], "labels": ["1"]}, timeout=5)
    assert r.status_code == 503 and "draining" in r.json()["message"]
    assert r.headers["Retry-After"] == "1"
    worker.join(timeout=20)
    stopper.join(timeout=20)
    assert slow["r"].json()["run_result"]["stdout"] == "done\n"  # finished within the grace
    assert not stopper.is_alive()
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"{url}/health", timeout=5)  # and then it stopped listening


def test_verifier_serve_http_port_end_to_end() -> None:
    """`verifier serve --http-port 0` logs the bound port, serves, and drains on SIGTERM."""
    proc = ServerProcess(0, "--http-port", "0", "--workers", "1")
    try:
        listening = next(json.loads(line) for line in proc.lines
                         if '"verifier listening"' in line)
        r = requests.post(f"http://127.0.0.1:{listening['http_port']}/get_reward", timeout=30,
                          json={"query": ["so \\boxed{4}"], "labels": ["4"]})
        assert r.json()["rewards"] == [1.0]
    finally:
        assert proc.terminate() == 0


def test_serve_flags() -> None:
    config = tyro.extras.subcommand_cli_from_dict(
        {"serve": ServeConfig}, args=["serve", "--http-port", "0", "--http-max-body-mb", "5",
                                      "--http-max-requests", "7"],
        config=(tyro.conf.OmitArgPrefixes,))
    assert (config.http_port, config.http_max_body_mb, config.http_max_requests) == (0, 5, 7)
    with pytest.raises(ValueError, match="http-max-body-mb"):
        ServeConfig(http_port=0, http_max_body_mb=0)
