"""Jobs across machines with separate network stacks (issue 12, docs/nodes.md "The namespace
test"): four Linux network namespaces stand for four machines on one LAN, joined by a bridge.

    namespace  role     address        link
    <tag>c     client   10.77.0.1/24   eth0, peer of vc on br0
    <tag>a     node-a   10.77.0.2/24   eth0, peer of va on br0
    <tag>b     node-b   10.77.0.3/24   eth0, peer of vb on br0
    <tag>x     node-c   10.77.0.4/24   eth0, peer of vx on br0 (reports a faked Tessera version)
    <tag>br    bridge   -              br0 with vc, va, vb, vx

The bridge lives in a namespace of its own, so nothing is added to the root namespace's network.
Each namespace has its loopback up and only its own address: a rank can reach another machine's
rank only over the bridge. The filesystem is shared (namespaces separate the network only), which
is what checkpoints need (docs/nodes.md: a shared output folder). The client (`nodes`, `launch`
and rank 0) runs in the client namespace; each agent runs in its namespace bound to its address,
on the default ports, with its own state folder and HOME.

- discovery by real UDP broadcast on the bridge (no --announce-to): the client hears the three
  agents, each from its own address; pairing by the code read from both sides' output;
- ddp with one rank per machine (client, node-a, node-b) gives the losses of `launch --nproc 3` on
  one machine (within 1e-6), after a pre-flight whose c10d link test crosses the bridge;
- node-c's version mismatch (TESSERA_AGENT_TEST_TESSERA_VERSION) is refused at pre-flight with
  its reason, and no rank starts anywhere;
- kill -9 of node-b's rank stops the job on every machine within the collective timeout, naming
  node-b and rank 2, with no process left in any namespace; the job then resumes from its last
  checkpoint on two machines (3 ranks -> 2, gradient accumulation 2 -> 3: the same 6 micro-batches
  per step) and completes with the losses of the uninterrupted 3-rank run;
- a rank stopped with SIGSTOP on node-b is named (rank 2, node-b's address; launch adds the
  node's name) within the collective timeout (TESSERA_DIST_TIMEOUT_S) and every machine's ranks
  stop.

It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` (Debian's iproute2); it skips saying
which is missing. Everything it makes is removed at the end, also when it fails: the namespaces
(their links go with them) and every process in them. Namespaces left by a run that was killed
(the name carries its pid) are removed by the next run.
"""
import atexit
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
from test_nodes import Process, cli  # noqa: E402

PREFIX = "tsnet"  # namespace names: PREFIX + pid + role letter
SUBNET = "10.77.0"
MACHINES = {"client": ("c", 1), "node-a": ("a", 2), "node-b": ("b", 3), "node-c": ("x", 4)}
FAKE_VERSION = "0.0.0-netns-test"
DIST_TIMEOUT_S = 5.0  # TESSERA_DIST_TIMEOUT_S for every rank (the agents pass the client's on)
LOSS_BOUND_SAME_LAYOUT = 1e-6  # the same ranks, the same sums: equal
# Another layout sums the same micro-batches in another order (per rank, then the mean over
# ranks): the last bits differ (test_zero_checkpoint measured 7e-8 relative).
LOSS_BOUND_OTHER_LAYOUT = 1e-5


def ip(*args, check=True):
    r = subprocess.run(["ip", *args], text=True, capture_output=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def namespace_pids(namespace):
    r = ip("netns", "pids", namespace, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def remove_namespace(namespace):
    for pid in namespace_pids(namespace):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while namespace_pids(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    ip("netns", "del", namespace, check=False)


def remove_stale_namespaces():
    """Namespaces of an earlier run that was killed before its cleanup (its pid is gone)."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(PREFIX + r"(\d+)[a-z]+", name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            remove_namespace(name)


def why_no_namespaces():
    if os.geteuid() != 0:
        return "not root: creating network namespaces needs CAP_NET_ADMIN and CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` command: install Debian's iproute2"
    probe = f"{PREFIX}{os.getpid()}probe"
    r = ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return ("cannot create a network namespace (root without CAP_NET_ADMIN or CAP_SYS_ADMIN, "
                f"as in a container?): ip netns add: {r.stderr.strip()}")
    try:
        for what, args in (("a bridge", "link add br0 type bridge"),
                           ("a veth pair", "link add v0 type veth peer name v1")):
            r = ip("-n", probe, *args.split(), check=False)
            if r.returncode != 0:
                return (f"cannot create {what} in a network namespace: ip {args}: "
                        f"{r.stderr.strip()}")
    finally:
        ip("netns", "del", probe, check=False)
    return None


class Lan:
    """The namespaces and the bridge; destroy() removes them and every process in them."""

    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.bridge = self.tag + "br"
        self.namespaces = {name: self.tag + letter for name, (letter, _) in MACHINES.items()}
        self.addresses = {name: f"{SUBNET}.{host}" for name, (_, host) in MACHINES.items()}
        self.made = []
        atexit.register(self.destroy)

    def build(self):
        ip("netns", "add", self.bridge)
        self.made.append(self.bridge)
        ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", self.bridge, "link", "set", "br0", "up")
        for name, (letter, _) in MACHINES.items():
            namespace = self.namespaces[name]
            ip("netns", "add", namespace)
            self.made.append(namespace)
            # Both ends made from the bridge's namespace: nothing passes through the root one.
            ip("-n", self.bridge, "link", "add", "v" + letter, "type", "veth", "peer", "name",
               "eth0", "netns", namespace)
            ip("-n", self.bridge, "link", "set", "v" + letter, "master", "br0", "up")
            ip("-n", namespace, "addr", "add", self.addresses[name] + "/24", "brd", "+", "dev",
               "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")
            ip("-n", namespace, "link", "set", "lo", "up")

    def pids(self, name):
        return namespace_pids(self.namespaces[name])

    def destroy(self):
        for namespace in reversed(self.made):
            remove_namespace(namespace)
        self.made = []


class NsProcess(Process):
    """test_nodes.Process run inside a namespace (`ip netns exec`, which execs the program: the
    pid is tessera-cli's), its lines kept with the time they arrived."""

    def __init__(self, namespace, args, env, cwd=None):
        self.lines = []
        self.queue = queue.Queue()
        self.timed = []  # (time.monotonic(), line)
        self.process = subprocess.Popen(["ip", "netns", "exec", namespace, cli(), *map(str, args)],
                                        env=env, cwd=cwd, text=True, bufsize=1,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.timed.append((time.monotonic(), line.rstrip("\n")))
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def first_time(self, pattern):
        regex = re.compile(pattern)
        return next((t for t, line in list(self.timed) if regex.search(line)), None)


def base_env(home: Path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TESSERA_AGENT_TEST_", "TESSERA_DIST_", "GLOO_SOCKET_IFNAME"))
           and k != "TESSERA_CPU_ADAM_ISA"}
    home.mkdir(parents=True, exist_ok=True)
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
                "XDG_STATE_HOME": str(home / "state"), "OMP_NUM_THREADS": "1",
                "TESSERA_DIST_TIMEOUT_S": str(DIST_TIMEOUT_S),
                "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S": "60"})
    return env


class Cluster:
    def __init__(self, tmp: Path, lan: Lan):
        self.tmp, self.lan = tmp, lan
        self.work = tmp / "work"  # model and data; every agent's --work-dir
        self.work.mkdir()
        self.env = base_env(tmp / "client-home")
        self.agents = {}
        self.discovered = []

    def run(self, machine, *args, timeout=180):
        """A tessera-cli command in `machine`'s namespace (None: the root namespace)."""
        prefix = ["ip", "netns", "exec", self.lan.namespaces[machine]] if machine else []
        return subprocess.run([*prefix, cli(), *map(str, args)], cwd=self.work, env=self.env,
                              text=True, capture_output=True, timeout=timeout)

    def start_agent(self, name, extra_env=None):
        env = dict(base_env(self.tmp / f"{name}-home"), **(extra_env or {}))
        agent = NsProcess(self.lan.namespaces[name],
                          ["agent", "--bind", self.lan.addresses[name], "--state-dir",
                           self.tmp / f"{name}-home" / "agent", "--name", name, "--work-dir",
                           self.work, "--grace-period", "2"], env)
        self.agents[name] = agent
        agent.wait_for(r"listening on %s:47611" % re.escape(self.lan.addresses[name]))
        return agent

    def pair(self, name, address, port):
        client = NsProcess(self.lan.namespaces["client"], ["nodes", "add", f"{address}:{port}"],
                           self.env)
        agent = self.agents[name]
        code = client.wait_for(r"pairing code (\d{6})").group(1)
        request = agent.wait_for(r"pairing request from .* at ([\d.]+): pairing code (\d{6})")
        assert request.group(1) == self.lan.addresses["client"], "the client's own address"
        assert request.group(2) == code
        client.wait_for(r"show the code")
        agent.answer(code)
        client.answer("yes")
        assert client.finish() == 0, client.output()
        agent.wait_for(r"paired with")

    def stop(self):
        for agent in self.agents.values():
            agent.stop()


def write_model_and_data(work: Path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tiny_tokenizer import byte_level_bpe

    corpus = [f"What is {a} plus {b}? {a + b}" for a in range(20) for b in range(20)]
    fast = byte_level_bpe(corpus, 300)
    fast.save_pretrained(work / "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 bos_token_id=0, eos_token_id=1, pad_token_id=2)
                     ).save_pretrained(work / "model")
    with open(work / "data.jsonl", "w") as f:
        for a in range(16):
            for b in range(16):
                row = {"instruction": f"What is {a} plus {b}?", "output": str(a + b)}
                f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = why_no_namespaces()
    if reason:
        pytest.skip(reason)
    remove_stale_namespaces()
    lan = Lan()
    c = None
    try:
        lan.build()
        c = Cluster(tmp_path_factory.mktemp("netns"), lan)
        write_model_and_data(c.work)
        c.start_agent("node-a")
        c.start_agent("node-b")
        c.start_agent("node-c", {"TESSERA_AGENT_TEST_TESSERA_VERSION": FAKE_VERSION})
        # Real broadcasts: the agents have no --announce-to; each sends to its subnet's broadcast
        # address, which the bridge carries to the client's namespace.
        for name in ("node-a", "node-b", "node-c"):
            c.agents[name].wait_for(r"announcing every 2 s on UDP port 47612 to "
                                    r"%s\.255 \(broadcast\)" % re.escape(SUBNET))
        found = c.run("client", "nodes", "discover", "--seconds", "4.5", "--json", timeout=30)
        assert found.returncode == 0, found.stderr
        c.discovered = json.loads(found.stdout)
        by_name = {a["name"]: a for a in c.discovered}
        for name in ("node-a", "node-b", "node-c"):
            assert name in by_name, c.discovered
            c.pair(name, by_name[name]["address"], by_name[name]["port"])
        yield c
    finally:
        if c is not None:
            c.stop()
        lan.destroy()


def job(c, name, steps, accumulation=2, save_every=0, nodes=None):
    # Relative model and data paths: each agent resolves them in its --work-dir (here the same
    # folder); the output folder is absolute, on the filesystem every namespace shares.
    spec = {
        "version": 1,
        "model": {"path": "model"},
        "dataset": {"train": "data.jsonl", "validation_split": 0.125},
        "training": {"steps": steps, "batch_size": 2, "gradient_accumulation": accumulation,
                     "learning_rate": 1e-3, "schedule": "constant", "seed": 7,
                     "save_every": save_every, "keep_last": 10},
        "strategy": {"name": "ddp", "options": {"device": "cpu"}},
        "output": {"dir": str(c.tmp / "out" / name)},
    }
    if nodes is not None:
        spec["nodes"] = {"ranks_per_node": [{"name": n, "nproc": k} for n, k in nodes]}
    path = c.work / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def events_of(c, name):
    return [json.loads(x) for x in (c.tmp / "out" / name / "events.jsonl").read_text().splitlines()]


def losses_by_step(events):
    return {e["step"]: e["loss"] for e in events if e["type"] == "metric" and "loss" in e}


def rank_pids(c):
    """Processes in any machine's namespace other than the agents: ranks, launch, link tests."""
    agents = {a.process.pid for a in c.agents.values()}
    return {name: [p for p in c.lan.pids(name) if p not in agents] for name in MACHINES}


def wait_until_nothing_runs(c, seconds=10):
    deadline = time.monotonic() + seconds
    while any(rank_pids(c).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return rank_pids(c)


def forget_agent_output(c):
    for agent in c.agents.values():
        agent.output()
        agent.lines.clear()


def test_agents_are_discovered_by_broadcast_and_paired(cluster):
    c = cluster
    by_name = {a["name"]: a for a in c.discovered}
    for name in ("node-a", "node-b", "node-c"):
        address = c.lan.addresses[name]
        assert by_name[name]["address"] == address and by_name[name]["port"] == 47611
        assert by_name[name]["seen_from"] == address, "the datagram came over the bridge"
    listed = c.run("client", "nodes", "list", "--json", timeout=30)
    assert listed.returncode == 0, listed.stderr
    paired = {n["name"]: n for n in json.loads(listed.stdout)}
    assert {n: paired[n]["address"] for n in ("node-a", "node-b", "node-c")} == \
        {n: c.lan.addresses[n] for n in ("node-a", "node-b", "node-c")}


REFERENCE_STEPS = 16  # within the first epoch: 224 rows / 12 per step


@pytest.fixture(scope="module")
def reference(cluster):
    """The uninterrupted job as 3 ranks on one machine (the root namespace, loopback)."""
    c = cluster
    r = c.run(None, "launch", "--nproc", 3, job(c, "reference", REFERENCE_STEPS, save_every=4))
    assert r.returncode == 0, r.stderr
    losses = losses_by_step(events_of(c, "reference"))
    assert sorted(losses) == list(range(1, REFERENCE_STEPS + 1)), losses
    return losses


def test_ddp_across_namespaces_equals_one_machine(cluster, reference):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "spread", REFERENCE_STEPS, save_every=4,
               nodes=[("local", 1), ("node-a", 1), ("node-b", 1)])
    started = time.monotonic()
    r = c.run("client", "launch", spec)
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stderr + "\n" + c.agents["node-b"].output()
    table = r.stderr.split("launch: 3 ranks")[0]
    assert "FAIL" not in table, table
    for node in ("node-a", "node-b"):
        assert re.search(rf"^\s+{node}\s+shared output\s+ok", table, re.M), table
        link = re.search(rf"^\s+{node}\s+c10d link\s+ok\s+latency ([\d.]+) ms.*?([\d.]+) MB/s",
                         table, re.M)
        assert link, table
        print(f"c10d link client -> {node} over the bridge: latency {link.group(1)} ms, "
              f"{link.group(2)} MB/s")
    client = c.lan.addresses["client"]
    assert f"rendezvous (MASTER_ADDR) at {client}" in r.stderr, "the route to the nodes"
    for name, rank in (("node-a", 1), ("node-b", 2)):
        assert c.agents[name].wait_for(
            rf"started ranks \[{rank}\] of 3 .*rendezvous at {re.escape(client)}:\d+")
        assert c.agents[name].wait_for(rf"rank {rank} \(pid \d+\) exited with code 0")
    events = events_of(c, "spread")
    assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
    got = losses_by_step(events)
    assert sorted(got) == sorted(reference)
    worst = max(abs(got[s] - reference[s]) / max(1.0, abs(reference[s])) for s in reference)
    assert worst <= LOSS_BOUND_SAME_LAYOUT, (got, reference)
    assert (c.tmp / "out" / "spread" / f"checkpoint-{REFERENCE_STEPS}" /
            "rng_state-rank2.safetensors").exists(), "node-b's part in the shared folder"
    assert wait_until_nothing_runs(c) == {n: [] for n in MACHINES}
    print(f"3 ranks on 3 namespaces: {elapsed:.1f} s with the pre-flight; losses vs one machine: "
          f"{worst:.1e}")


def test_version_mismatch_is_refused_at_preflight(cluster):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "mismatch", 4, nodes=[("local", 1), ("node-a", 1), ("node-c", 1)])
    r = c.run("client", "launch", spec, timeout=60)
    assert r.returncode == 1, r.stderr
    row = re.search(r"^\s+node-c\s+tessera version\s+FAIL\s+(.*)$", r.stderr, re.M)
    assert row, r.stderr
    assert f"node-c runs Tessera {FAKE_VERSION}" in row.group(1), row.group(1)
    assert f"TESSERA_AGENT_TEST_TESSERA_VERSION={FAKE_VERSION}" in row.group(1), \
        "a faked fact is named as a test override"
    assert re.search(r"^\s+node-a\s+tessera version\s+ok", r.stderr, re.M), r.stderr
    assert "pre-flight checks failed (1)" in r.stderr and "no rank was started" in r.stderr
    events = events_of(c, "mismatch")
    assert [e["type"] for e in events] == ["error", "done"]
    assert "node-c: tessera version" in events[0]["message"]
    for name in ("node-a", "node-c"):
        assert "started ranks" not in c.agents[name].output()
    assert rank_pids(c) == {n: [] for n in MACHINES}


def started_rank(c, node, rank, world_size, launch):
    """The pid of `rank`, as `node`'s agent says it started it."""
    try:
        line = c.agents[node].wait_for(
            rf"started ranks \[{rank}\] of {world_size} \(pids \[(\d+)\]\)", timeout=60)
    except AssertionError as e:
        raise AssertionError(f"{e}\nlaunch's output:\n{launch.output()}") from None
    return int(line.group(1))


def latest_checkpoint(folder: Path):
    done = [int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*")
            if p.name.split("-")[1].isdigit() and (p / "manifest.json").exists()]
    return max(done) if done else None


def test_kill9_stops_every_machine_and_the_job_resumes_on_fewer(cluster, reference):
    c = cluster
    forget_agent_output(c)
    nodes = [("local", 1), ("node-a", 1), ("node-b", 1)]
    spec = job(c, "killed", REFERENCE_STEPS, save_every=4, nodes=nodes)
    out = c.tmp / "out" / "killed"
    launch = NsProcess(c.lan.namespaces["client"], ["launch", spec, "--no-link"], c.env,
                       cwd=c.work)
    try:
        pid = started_rank(c, "node-b", 2, 3, launch)
        assert pid in c.lan.pids("node-b"), "node-b's rank runs in node-b's namespace"
        deadline = time.monotonic() + 60
        while latest_checkpoint(out) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert latest_checkpoint(out) is not None, launch.output()
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        code = launch.finish(timeout=60)
        stopped_in = time.monotonic() - killed_at
    finally:
        launch.stop()
    stderr = launch.output()
    assert code == 128 + signal.SIGKILL, stderr
    assert re.search(rf"node node-b rank 2 \(pid {pid}\) was killed by signal 9", stderr), stderr
    assert "stopping the other ranks on every node" in stderr
    # The bound: the survivors see the dead rank's connections close at once and are stopped
    # by launch; the collective timeout is the most the job may wait for it.
    assert stopped_in <= DIST_TIMEOUT_S, (stopped_in, stderr)
    assert wait_until_nothing_runs(c) == {n: [] for n in MACHINES}, "a process left behind"
    assert c.agents["node-a"].wait_for(r"rank 1 \(pid \d+\) (was killed|exited)")
    print(f"kill -9 of node-b's rank: every machine stopped {stopped_in:.2f} s later "
          f"(bound {DIST_TIMEOUT_S:.0f} s)")

    # Resume on two machines. ddp's state is replicated (any rank's checkpoint holds all of it)
    # and the data order is the one-process order, each step reading ranks x accumulation
    # micro-batches: 2 ranks x 3 read the same 6 per step as 3 ranks x 2, so the resumed job
    # continues the uninterrupted trajectory.
    step = latest_checkpoint(out)
    assert step < REFERENCE_STEPS, "killed before the end"
    resumed = job(c, "resumed", REFERENCE_STEPS, accumulation=3, save_every=4,
                  nodes=[("local", 1), ("node-a", 1)])
    forget_agent_output(c)
    r = c.run("client", "launch", resumed, "--resume", out / f"checkpoint-{step}", "--no-link")
    assert r.returncode == 0, r.stderr
    assert c.agents["node-a"].wait_for(r"started ranks \[1\] of 2")
    assert "started ranks" not in c.agents["node-b"].output()
    events = events_of(c, "resumed")
    assert events[-1]["type"] == "done" and events[-1]["status"] == "completed"
    logs = [e["message"] for e in events if e["type"] == "log"]
    assert any(f"resumed from {out / f'checkpoint-{step}'} at step {step}" in m for m in logs), logs
    assert any("saved by 3 processes, this run has 2" in m for m in logs), logs
    got = losses_by_step(events)
    assert sorted(got) == list(range(step + 1, REFERENCE_STEPS + 1)), got
    worst = max(abs(got[s] - reference[s]) / abs(reference[s]) for s in got)
    assert worst <= LOSS_BOUND_OTHER_LAYOUT, (got, reference)
    assert wait_until_nothing_runs(c) == {n: [] for n in MACHINES}
    print(f"resumed from checkpoint-{step} on 2 machines: losses vs the uninterrupted 3-rank run "
          f"{worst:.1e} relative")


def test_a_hung_rank_is_named_within_the_timeout(cluster):
    c = cluster
    forget_agent_output(c)
    spec = job(c, "hung", 100000, nodes=[("local", 1), ("node-a", 1), ("node-b", 1)])
    events_path = c.tmp / "out" / "hung" / "events.jsonl"
    grace = 2.0  # SIGTERM cannot stop a stopped process: SIGKILL comes after the grace period
    launch = NsProcess(c.lan.namespaces["client"],
                       ["launch", spec, "--no-link", "--grace-period", grace], c.env, cwd=c.work)
    pid, done = None, False
    try:
        pid = started_rank(c, "node-b", 2, 3, launch)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # training: every rank past the rendezvous
            text = events_path.read_text() if events_path.exists() else ""
            if '"type":"metric"' in text.replace(" ", ""):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("no metric within 60 s:\n" + launch.output())
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        code = launch.finish(timeout=60)
        ended_in = time.monotonic() - stopped_at
        done = True
    finally:
        launch.stop()
        if pid is not None and not done:  # the agent is to kill it: only when the test broke
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    stderr = launch.output()
    assert code != 0, stderr
    # A survivor's collective times out, and the rank silent for three heartbeats is named, with
    # the address it reached rank 0 from: node-b's.
    named = rf"rank 2 on .*\({re.escape(c.lan.addresses['node-b'])}\).*has sent no heartbeat"
    detected = launch.first_time(named)
    assert detected is not None, stderr
    detected_in = detected - stopped_at
    heartbeat = min(5.0, max(0.1, DIST_TIMEOUT_S / 10))
    bound = DIST_TIMEOUT_S + 4 * heartbeat + 2.0  # + 2 s for a busy machine
    assert detected_in <= bound, (detected_in, stderr)
    events = [json.loads(x) for x in events_path.read_text().splitlines()]
    error = next(e for e in events if e["type"] == "error")
    assert error.get("rank") == 2, error
    assert events[-1]["type"] == "done" and events[-1]["status"] == "failed"
    assert "stopping the other ranks on every node" in stderr
    # Launch saw a survivor fail; it says which machine the rank at fault ran on, by its name.
    assert re.search(r"the ranks name rank 2, on node node-b \(%s\), as the cause: .*no heartbeat"
                     % re.escape(c.lan.addresses["node-b"]), stderr), stderr
    assert ended_in <= bound + grace + 5.0, (ended_in, stderr)
    assert wait_until_nothing_runs(c) == {n: [] for n in MACHINES}, "a process left behind"
    print(f"SIGSTOP of node-b's rank: named after {detected_in:.2f} s (bound {bound:.1f} s: the "
          f"timeout {DIST_TIMEOUT_S:.0f} s + 4 heartbeats + 2 s), launch ended after "
          f"{ended_in:.2f} s")
