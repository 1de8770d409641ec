"""`tessera-cli launch` across LAN nodes (issue 12, docs/nodes.md): three agents on 127.0.0.1, each
with its own port and state folder, paired by this test through both prompts, act as three nodes.

- ddp with 1 rank here + 1 on node-a + 1 on node-b gives the losses of `launch --nproc 3` (same
  data, same seed: equal within 1e-6); the pre-flight table lists every node; remote ranks' output
  comes back prefixed `[node-a rank 1]`.
- node-c's agent runs jobs in an empty folder, so the spec's relative data path is missing there:
  launch refuses before any rank starts, naming node-c, the check and the file.
- kill -9 of node-b's rank stops every rank on every node: launch names node-b and rank 2 and the
  signal, and no rank process is left on any node.
- Ctrl-C to launch reaches the ranks on every node: all stop at one step with a checkpoint that
  holds every rank's random state, launch exits 130, nothing is left.
- Bad "nodes" fields and --nodes values are refused naming the field; a spawn signed by a client
  the agent never paired with is refused as unpaired.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from test_nodes import Process, cli, free_port  # noqa: E402
from tiny_tokenizer import byte_level_bpe  # noqa: E402


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.work = tmp / "work"  # the client's folder, and node-a's and node-b's --work-dir
        self.work.mkdir()
        self.empty = tmp / "empty"  # node-c's --work-dir: the job's files are not there
        self.empty.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("TESSERA_AGENT_TEST_") and k != "TESSERA_CPU_ADAM_ISA"}
        self.env.update({"XDG_CONFIG_HOME": str(tmp / "client-config"), "OMP_NUM_THREADS": "1",
                         "TESSERA_DIST_TIMEOUT_S": "10", "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S": "60"})
        self.agents = {}

    def start_agent(self, name, work_dir):
        port = free_port()
        agent = Process(["agent", "--bind", "127.0.0.1", "--port", str(port), "--state-dir",
                         str(self.tmp / f"{name}-state"), "--name", name, "--no-broadcast",
                         "--discovery-port", str(free_port()), "--work-dir", str(work_dir),
                         "--grace-period", "5"], self.env)
        agent.wait_for(r"listening on 127\.0\.0\.1:%d" % port)
        agent.port = port
        self.agents[name] = agent
        # Paired as a person would: each side is given the code the other shows.
        client = Process(["nodes", "add", f"127.0.0.1:{port}"], self.env)
        code = client.wait_for(r"pairing code (\d{6})").group(1)
        assert agent.wait_for(r"pairing code (\d{6})").group(1) == code
        client.wait_for(r"show the code")
        agent.answer(code)
        client.answer("yes")
        assert client.finish() == 0, client.output()
        agent.wait_for(r"paired with")
        return agent

    def launch(self, *args, timeout=120):
        return subprocess.run([cli(), "launch", *map(str, args)], cwd=self.work, env=self.env,
                              text=True, capture_output=True, timeout=timeout)

    def stop(self):
        for agent in self.agents.values():
            agent.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("multinode"))
    corpus = [f"What is {a} plus {b}? {a + b}" for a in range(20) for b in range(20)]
    fast = byte_level_bpe(corpus, 300)
    fast.save_pretrained(c.work / "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 bos_token_id=0, eos_token_id=1, pad_token_id=2)
                     ).save_pretrained(c.work / "model")
    with open(c.work / "data.jsonl", "w") as f:
        for a in range(8):
            for b in range(8):
                f.write(json.dumps({"instruction": f"What is {a} plus {b}?", "output": str(a + b)}) + "\n")
    try:
        for name, work in (("node-a", c.work), ("node-b", c.work), ("node-c", c.empty)):
            c.start_agent(name, work)
        yield c
    finally:
        c.stop()


def job(c, name, nodes=None, steps=6, output=None):
    # Relative model and data paths: each node resolves them in its agent's --work-dir.
    spec = {
        "version": 1,
        "model": {"path": "model"},
        "dataset": {"train": "data.jsonl", "validation_split": 0.125},
        "training": {"steps": steps, "batch_size": 2, "learning_rate": 1e-3,
                     "schedule": "constant", "seed": 7, "eval_every": 3},
        "strategy": {"name": "ddp", "options": {"device": "cpu"}},
        "output": {"dir": output or str(c.tmp / "out" / name)},
    }
    if nodes is not None:
        spec["nodes"] = {"ranks_per_node": [{"name": n, "nproc": k} for n, k in nodes]}
    path = c.work / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def events_of(c, name):
    return [json.loads(line) for line in (c.tmp / "out" / name / "events.jsonl").read_text().splitlines()]


def losses_of(events):
    return [e["loss"] for e in events if e["type"] == "metric" and "loss" in e]


def rank_processes(*markers):
    """Processes running `tessera-cli run` on a spec whose path holds one of `markers`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if len(text) >= 3 and text[0].endswith("tessera-cli") and text[1] == "run" and \
                any(m in text[2] for m in markers):
            found.append((int(entry.name), " ".join(text)))
    return found


def forget_agent_output(c):
    """Each test reads the agents' lines printed from its start on."""
    for agent in c.agents.values():
        agent.output()
        agent.lines.clear()


def test_ddp_across_three_nodes_equals_three_local_ranks(cluster):
    c = cluster
    forget_agent_output(c)
    local = c.launch("--nproc", 3, job(c, "local-3"))
    assert local.returncode == 0, local.stderr
    started = time.monotonic()
    spread = c.launch(job(c, "nodes-3", nodes=[("local", 1), ("node-a", 1), ("node-b", 1)]))
    elapsed = time.monotonic() - started
    assert spread.returncode == 0, spread.stderr + c.agents["node-a"].output()
    # One pre-flight table with every node, then the run.
    table = spread.stderr.split("launch: 3 ranks")[0]
    for node in ("local", "node-a", "node-b"):
        assert re.search(rf"^\s+{node}\s+job files\s+ok", table, re.M), table
    for node in ("node-a", "node-b"):
        assert re.search(rf"^\s+{node}\s+shared output\s+ok", table, re.M), table
    assert re.search(r"^\s+node-a\s+c10d link\s+ok\s+latency", table, re.M), table
    assert "FAIL" not in table
    assert "rendezvous (MASTER_ADDR) at 127.0.0.1" in spread.stderr
    # Each agent started one rank with the variables the client computed.
    assert c.agents["node-a"].wait_for(r"started ranks \[1\] of 3 .*rendezvous at 127\.0\.0\.1:\d+")
    assert c.agents["node-b"].wait_for(r"started ranks \[2\] of 3")
    assert c.agents["node-a"].wait_for(r"rank 1 \(pid \d+\) exited with code 0")

    local_events, spread_events = events_of(c, "local-3"), events_of(c, "nodes-3")
    assert spread_events[-1] == {**spread_events[-1], "type": "done", "status": "completed"}
    expected, got = losses_of(local_events), losses_of(spread_events)
    assert len(got) == 6 and len(expected) == 6
    for a, b in zip(expected, got):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a)), (expected, got)
    metrics = [e for e in spread_events if e["type"] == "metric" and "loss" in e]
    assert all([r["rank"] for r in m["ranks"]] == [0, 1, 2] for m in metrics)
    # The remote ranks' checkpoint parts land in the same (here shared) output folder.
    assert (c.tmp / "out" / "nodes-3" / "checkpoint-6" / "rng_state-rank2.safetensors").exists()
    print(f"3 ranks on 3 nodes: {elapsed:.1f} s including pre-flight")


def test_preflight_failure_names_node_check_and_file(cluster):
    c = cluster
    forget_agent_output(c)
    # A relative output folder: node-a resolves it to the client's, node-c to a folder of its own.
    spec = job(c, "preflight", nodes=[("local", 1), ("node-a", 1), ("node-c", 1)],
               output="out-preflight")
    started = time.monotonic()
    r = c.launch(spec, "--no-link")
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - started < 30
    table = r.stderr
    assert re.search(r"^\s+node-a\s+job files\s+ok", table, re.M), table
    line = re.search(r"^\s+node-c\s+job files\s+FAIL\s+(.*)$", table, re.M)
    assert line, table
    assert "node-c lacks" in line.group(1) and "data.jsonl" in line.group(1)
    assert str(c.empty / "data.jsonl") in line.group(1), "the path as resolved on the node"
    assert str(c.empty / "model") in line.group(1)
    assert re.search(r"^\s+node-a\s+shared output\s+ok", table, re.M), table
    shared = re.search(r"^\s+node-c\s+shared output\s+FAIL\s+(.*)$", table, re.M)
    assert shared and str(c.empty / "out-preflight") in shared.group(1), table
    assert "pre-flight checks failed (2)" in r.stderr and "no rank was started" in r.stderr
    # Nothing ran: no job.json, the stream holds the refusal only, no agent started a rank; the
    # file written for the shared-folder check is gone.
    out = c.work / "out-preflight"
    assert sorted(p.name for p in out.iterdir()) == ["events.jsonl"]
    assert not (out / "job.json").exists()
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["error", "done"]
    assert "node-c: job files" in events[0]["message"]
    assert "started ranks" not in c.agents["node-c"].output()


def test_kill9_of_a_remote_rank_stops_every_node(cluster):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "killed", nodes=[("local", 1), ("node-a", 1), ("node-b", 1)], steps=100000)
    process = subprocess.Popen([cli(), "launch", str(spec), "--no-link", "--grace-period", "5"],
                               cwd=c.work, env=c.env, text=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        node_b = c.agents["node-b"]
        pid = int(node_b.wait_for(r"started ranks \[2\] of 3 \(pids \[(\d+)\]\)", timeout=60).group(1))
        events = c.tmp / "out" / "killed" / "events.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # training, every rank past the rendezvous
            if events.exists() and '"type":"metric"' in events.read_text().replace(" ", ""):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no metric within 60 s")
        assert len(rank_processes(str(spec), "node-a-state", "node-b-state")) == 3
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        stopped_in = time.monotonic() - killed_at
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGKILL, stderr
    assert re.search(rf"node node-b rank 2 \(pid {pid}\) was killed by signal 9", stderr), stderr
    assert "stopping the other ranks on every node" in stderr
    assert stopped_in < 20, stopped_in
    # Nothing left on any "node": the local rank, node-a's and node-b's.
    deadline = time.monotonic() + 10
    while rank_processes(str(spec), "node-a-state", "node-b-state") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rank_processes(str(spec), "node-a-state", "node-b-state") == []
    assert c.agents["node-a"].wait_for(r"rank 1 \(pid \d+\) (was killed|exited)")
    # node-a's rank was told to stop; its output came back prefixed with its node.
    assert re.search(r"^\[node-a rank 1\] ", stderr, re.M), stderr
    # Rank 0's stream ends with its error naming the dead rank.
    events = [json.loads(x) for x in (c.tmp / "out" / "killed" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "done" and events[-1]["status"] == "failed"
    assert any(e["type"] == "error" and e.get("rank") == 2 for e in events), events[-3:]
    print(f"kill -9 of node-b's rank: launch ended {stopped_in:.1f} s later")


@pytest.mark.parametrize("nodes, option, message", [
    ({"ranks_per_node": [{"name": "node-a", "nproc": 1}]}, None,
     'nodes.ranks_per_node does not list this machine ("local")'),
    ([{"name": "local"}, {"name": "node-a"}, {"name": "node-a", "nproc": 2}], None,
     'nodes.ranks_per_node[2].name "node-a" is listed twice'),
    ({"ranks_per_node": [{"name": "local", "nproc": 0}]}, None,
     "nodes.ranks_per_node[0].nproc must be at least 1"),
    ({"ranks_per_node": [{"name": "local"}], "master_port": 70000}, None,
     "nodes.master_port must be a TCP port"),
    ({"ranks_per_node": [{"name": "local", "procs": 2}]}, None,
     'nodes.ranks_per_node[0].procs is not a known field'),
    (None, "local:1,node-a:x", '--nodes local:1,node-a:x: "node-a:x" is not NAME:NPROC'),
    (None, "local:1,nobody:1", 'no paired node is called "nobody"'),
])
def test_bad_nodes_are_refused_naming_the_field(cluster, nodes, option, message):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "bad-nodes")
    if nodes is not None:
        doc = json.loads(spec.read_text())
        doc["nodes"] = nodes
        spec.write_text(json.dumps(doc))
    r = c.launch(spec, *(["--nodes", option, "--no-link"] if option else []), timeout=30)
    assert r.returncode in (1, 2), r.stderr
    assert message in r.stderr, r.stderr
    assert "started ranks" not in "".join(a.output() for a in c.agents.values())


def test_ctrl_c_reaches_every_rank_on_every_node(cluster):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "interrupted", nodes=[("local", 1), ("node-a", 1), ("node-b", 1)], steps=100000)
    process = subprocess.Popen([cli(), "launch", str(spec), "--no-link"], cwd=c.work, env=c.env,
                               text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        events = c.tmp / "out" / "interrupted" / "events.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if events.exists() and '"type":"metric"' in events.read_text().replace(" ", ""):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("no metric within 60 s")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    # Each node's rank got the signal and stopped as asked, at the step the ranks agreed on.
    assert c.agents["node-a"].wait_for(r"rank 1 \(pid \d+\) exited with code 130")
    assert c.agents["node-b"].wait_for(r"rank 2 \(pid \d+\) exited with code 130")
    stream = [json.loads(x) for x in events.read_text().splitlines()]
    assert stream[-1]["type"] == "done" and stream[-1]["status"] == "stopped", stream[-2:]
    saved = [e for e in stream if e["type"] == "checkpoint"]
    assert saved, "the stop wrote a checkpoint"
    folder = Path(saved[-1]["path"])
    assert (folder / "rng_state-rank1.safetensors").exists()
    assert (folder / "rng_state-rank2.safetensors").exists()
    assert rank_processes(str(spec), "node-a-state", "node-b-state") == []


def test_spawn_from_an_unpaired_client_is_refused(cluster):
    from test_nodes import exchange, signed
    c = cluster
    forget_agent_output(c)
    agent = c.agents["node-a"]
    body = {"what": "spawn", "job": json.loads(job(c, "unpaired").read_text()), "ranks": [1],
            "world_size": 2, "master_addr": "127.0.0.1", "master_port": free_port()}
    answer = exchange(agent.port, signed("ab" * 16, bytes(32), body))
    assert answer["error"]["code"] == "unpaired", answer
    assert "started ranks" not in agent.output()
