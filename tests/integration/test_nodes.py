"""LAN nodes (engine/nodes, docs/nodes.md) on loopback: `tessera-cli agent` bound to 127.0.0.1 with
a state folder in a temporary folder and its announcements sent to 127.0.0.1 on a free UDP port,
and the `tessera-cli nodes` client with its own XDG_CONFIG_HOME. The protocol's authentication is
checked by requests this test builds itself from docs/nodes.md (an independent HMAC)."""
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest


def cli() -> str:
    path = os.environ.get("TESSERA_CLI")
    if not path:
        pytest.skip("TESSERA_CLI is not set (run through ctest)")
    return path


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Process:
    """A tessera-cli process with a pipe to its stdin and its output read line by line."""

    def __init__(self, args, env, stdin=True):
        self.lines = []
        self.queue = queue.Queue()
        self.process = subprocess.Popen([cli(), *args], env=env, text=True, bufsize=1,
                                        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def wait_for(self, pattern, timeout=30.0):
        """The first match of `pattern` in a line printed from now on (or already printed)."""
        regex = re.compile(pattern)
        for line in self.lines:
            if m := regex.search(line):
                return m
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if m := regex.search(line):
                return m
        raise AssertionError(f"no line matching {pattern!r}; output so far:\n" + self.output())

    def answer(self, text):
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def finish(self, timeout=30.0) -> int:
        code = self.process.wait(timeout=timeout)
        while (line := self.queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    def output(self) -> str:
        while True:
            try:
                line = self.queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "\n".join(self.lines)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Setup:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.state_dir = tmp_path / "agent-state"
        self.config_home = tmp_path / "client-config"
        self.port = free_port()
        self.discovery_port = free_port(socket.SOCK_DGRAM)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("TESSERA_AGENT_TEST_") and k != "TESSERA_CPU_ADAM_ISA"}
        self.env["XDG_CONFIG_HOME"] = str(self.config_home)
        self.agents = []

    def start_agent(self, *extra, env=None) -> Process:
        environment = dict(self.env, **(env or {}))
        agent = Process(["agent", "--bind", "127.0.0.1", "--port", str(self.port), "--state-dir",
                         str(self.state_dir), "--name", "test-node", "--discovery-port",
                         str(self.discovery_port), "--announce-to", "127.0.0.1", *extra],
                        environment)
        self.agents.append(agent)
        agent.wait_for(r"listening on 127\.0\.0\.1:%d" % self.port)
        return agent

    def cli(self, *args, timeout=60):
        return subprocess.run([cli(), *args], env=self.env, text=True, capture_output=True,
                              timeout=timeout)

    def nodes_json(self) -> Path:
        return self.config_home / "tessera" / "nodes.json"

    def stop(self):
        for agent in self.agents:
            agent.stop()


@pytest.fixture
def setup(tmp_path):
    s = Setup(tmp_path)
    yield s
    s.stop()


def pair(s: Setup, agent: Process):
    """Pairs through both prompts, answering each with the code the other side shows."""
    client = Process(["nodes", "add", f"127.0.0.1:{s.port}"], s.env)
    client_code = client.wait_for(r"pairing code (\d{6})").group(1)
    agent_code = agent.wait_for(r"pairing code (\d{6})").group(1)
    assert client_code == agent_code
    client.wait_for(r"Does \"test-node\" show the code")
    agent.answer(agent_code)  # the agent's user types the code the client shows
    client.answer("yes")
    assert client.finish() == 0, client.output()
    agent.wait_for(r"paired with")
    return client_code


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the protocol, rebuilt here from docs/nodes.md ---------------------------------------------

def send_message(sock, message):
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def receive_message(sock):
    def exact(n):
        buffer = b""
        while len(buffer) < n:
            chunk = sock.recv(n - len(buffer))
            assert chunk, "the agent closed the connection"
            buffer += chunk
        return buffer
    (size,) = struct.unpack(">I", exact(4))
    return json.loads(exact(size))


def signed(client_id, secret, body, nonce=None, timestamp=None):
    nonce = nonce or secrets.token_hex(16)
    timestamp = int(time.time()) if timestamp is None else timestamp
    text = json.dumps(body)
    mac_input = f"tessera-nodes-request-v1\n{client_id}\n{nonce}\n{timestamp}\n{text}".encode()
    return {"type": "request", "client_id": client_id, "nonce": nonce, "timestamp": timestamp,
            "body": text, "hmac": hmac.new(secret, mac_input, hashlib.sha256).hexdigest()}


def exchange(port, envelope):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        send_message(sock, envelope)
        return receive_message(sock)


def loopback_copy_mb_s(size=64 << 20) -> float:
    """MB/s of one TCP copy of `size` bytes over 127.0.0.1, timed here (best of three)."""
    payload = bytes(size)
    best = 0.0
    for _ in range(3):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        sender = threading.Thread(
            target=lambda: socket.create_connection(server.getsockname()).sendall(payload))
        start = time.perf_counter()
        sender.start()
        connection, _ = server.accept()
        buffer = bytearray(size)
        view = memoryview(buffer)
        got = 0
        while got < size:
            got += connection.recv_into(view[got:])
        elapsed = time.perf_counter() - start
        sender.join()
        connection.close()
        server.close()
        best = max(best, size / elapsed / 1e6)
    return best


# --- tests -------------------------------------------------------------------------------------

def test_discovery_hears_the_announcement(setup):
    setup.start_agent()
    result = setup.cli("nodes", "discover", "--seconds", "3", "--discovery-port",
                       str(setup.discovery_port), "--json")
    assert result.returncode == 0, result.stderr
    heard = json.loads(result.stdout)
    mine = [a for a in heard if a["name"] == "test-node"]
    assert mine, heard
    assert mine[0]["address"] == "127.0.0.1" and mine[0]["port"] == setup.port
    assert mine[0]["paired_here"] is False and mine[0]["paired_clients"] == 0
    assert mine[0]["version"]


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_agent_with_128_plus_the_signal(setup, signal_number):
    """docs/exit-codes.md: a command stopped by signal N exits 128 + N, as the shell reports it
    (a service manager or a script tells a stop from a clean exit by it; the agent said 0)."""
    agent = setup.start_agent()
    agent.process.send_signal(signal_number)
    assert agent.finish() == 128 + signal_number, agent.output()
    assert "agent stopped" in agent.output()


def test_a_second_agent_on_the_same_state_folder_is_refused(setup):
    """Two agents on one state folder would overwrite each other's pairings (clients.json) and
    announce the same node id: the second is refused at once, naming the folder (it started
    without a word)."""
    setup.start_agent()
    second = setup.cli("agent", "--bind", "127.0.0.1", "--port", str(free_port()), "--state-dir",
                       str(setup.state_dir), "--name", "other", "--no-broadcast", timeout=30)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "another agent runs with this state folder" in second.stderr and str(setup.state_dir) in second.stderr


def test_pairing_with_matching_codes_keeps_private_secrets_and_checks_pass(setup):
    agent = setup.start_agent()
    assert "neither authenticated nor encrypted" in agent.output()  # the c10d warning
    pair(setup, agent)

    # Secrets: 0600 files in 0700 folders on both sides; the same secret on both.
    client_file = setup.nodes_json()
    for path in (client_file, setup.state_dir / "clients.json", setup.state_dir / "agent.json"):
        assert mode(path) == 0o600, (path, oct(mode(path)))
    assert mode(setup.state_dir) == 0o700 and mode(client_file.parent) == 0o700
    client_side = json.loads(client_file.read_text())
    agent_side = json.loads((setup.state_dir / "clients.json").read_text())
    assert client_side["nodes"][0]["secret"] == agent_side["clients"][0]["secret"]
    assert len(bytes.fromhex(client_side["nodes"][0]["secret"])) == 32
    assert not list(setup.state_dir.glob(".*tmp*")) and not list(client_file.parent.glob(".*tmp*"))

    listed = json.loads(setup.cli("nodes", "list", "--json").stdout)
    assert [n["name"] for n in listed] == ["test-node"]

    # Pre-flight checks with the c10d link test: all pass on this machine against itself.
    result = setup.cli("nodes", "check", "test-node", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) >= {"tessera version", "libtorch version", "cpu isa", "cuda / nccl",
                           "free ram", "free disk", "free gpu memory", "c10d link"}
    assert all(c["ok"] for c in checks.values()), checks
    link = checks["c10d link"]["measured"]
    assert link["bytes"] == 64 << 20 and link["latency_ms"] > 0 and link["bandwidth_mb_s"] > 0
    assert abs(link["bandwidth_mb_s"] - link["bytes"] / (link["large_ms"] / 1e3) / 1e6) < 1e-6 * \
        link["bandwidth_mb_s"]
    # The all_reduce moves its bytes through loopback TCP too: its bandwidth must be of the order
    # of a plain loopback copy timed here (a ring all_reduce on 2 ranks sends the whole buffer
    # once per rank, plus the sums; not more than a few times faster, not 50 times slower).
    copy_mb_s = loopback_copy_mb_s()
    assert copy_mb_s / 50 < link["bandwidth_mb_s"] < copy_mb_s * 4, (link, copy_mb_s)
    # A smaller all_reduce takes less time: the figure is measured, not a constant.
    small = json.loads(setup.cli("nodes", "check", "test-node", "--json", "--link-bytes",
                                 "4MiB").stdout)
    small_link = {c["name"]: c for c in small["checks"]}["c10d link"]["measured"]
    assert small_link["bytes"] == 4 << 20 and small_link["large_ms"] < link["large_ms"]
    # The free RAM reported is the machine's, as /proc/meminfo says (within a moving 20%).
    available = int(re.search(r"MemAvailable:\s+(\d+) kB",
                              Path("/proc/meminfo").read_text()).group(1)) * 1024
    reported = report["facts"]["ram_available"]
    assert 0.8 * available < reported < 1.2 * available or reported < available  # cgroup cap

    human = setup.cli("nodes", "check", "test-node")
    assert human.returncode == 0 and "all 8 checks passed" in human.stdout, human.stdout
    assert re.search(r"latency \d+\.\d+ ms .* bandwidth \d+ MB/s", human.stdout), human.stdout


def test_pairing_with_a_wrong_code_fails_on_both_sides(setup):
    # The client expects another code: it refuses, and the agent stops asking and stores nothing.
    agent = setup.start_agent()
    client = Process(["nodes", "add", f"127.0.0.1:{setup.port}", "--expect-code", "000000"],
                     setup.env)
    code = client.wait_for(r"pairing code (\d{6})").group(1)
    if code == "000000":
        pytest.skip("this pairing's code happened to be 000000")
    assert client.finish() == 1
    assert "pairing refused: the code expected by --expect-code (000000) is not this pairing's " \
           f"code ({code})" in client.output()
    agent.wait_for(r"refused by the client")
    assert not (setup.state_dir / "clients.json").exists()
    assert json.loads(setup.nodes_json().read_text())["nodes"] == []

    # The agent's side refuses (--accept-code with another code): the client is told why.
    agent.stop()
    agent = setup.start_agent("--accept-code", "000000")
    client = Process(["nodes", "add", f"127.0.0.1:{setup.port}"], setup.env)
    code = client.wait_for(r"pairing code (\d{6})").group(1)
    if code == "000000":
        pytest.skip("this pairing's code happened to be 000000")
    client.answer(code)
    assert client.finish() == 1
    assert "the agent refused the pairing: the code given by --accept-code (000000) is not " \
           f"this pairing's code ({code})" in client.output(), client.output()
    agent.wait_for(r"refused: the code given by --accept-code")
    assert not (setup.state_dir / "clients.json").exists()
    assert json.loads(setup.nodes_json().read_text())["nodes"] == []


def test_unpaired_tampered_replayed_and_stale_requests_are_refused(setup):
    agent = setup.start_agent()
    pair(setup, agent)
    stored = json.loads(setup.nodes_json().read_text())
    client_id = stored["client_id"]
    secret = bytes.fromhex(stored["nodes"][0]["secret"])

    # A good request, and the agent's signed answer verified here.
    envelope = signed(client_id, secret, {"what": "ping"})
    answer = exchange(setup.port, envelope)
    mac_input = f"tessera-nodes-response-v1\n{envelope['nonce']}\n{answer['body']}".encode()
    assert hmac.compare_digest(answer["hmac"],
                               hmac.new(secret, mac_input, hashlib.sha256).hexdigest())
    assert json.loads(answer["body"])["name"] == "test-node"

    def refusal(env):
        reply = exchange(setup.port, env)
        assert "error" in reply and "body" not in reply, reply
        return reply["error"]

    # The same request again: replayed.
    e = refusal(envelope)
    assert e["code"] == "replayed_nonce" and "already used" in e["message"]
    # A flipped bit in the HMAC.
    bad = signed(client_id, secret, {"what": "ping"})
    bad["hmac"] = ("0" if bad["hmac"][0] != "0" else "1") + bad["hmac"][1:]
    e = refusal(bad)
    assert e["code"] == "bad_hmac" and "does not verify" in e["message"]
    # A body changed after signing.
    tampered = signed(client_id, secret, {"what": "ping"})
    tampered["body"] = json.dumps({"what": "check"})
    assert refusal(tampered)["code"] == "bad_hmac"
    # Signed with another secret.
    assert refusal(signed(client_id, secrets.token_bytes(32), {"what": "ping"}))["code"] == \
        "bad_hmac"
    # Two minutes old, correctly signed.
    e = refusal(signed(client_id, secret, {"what": "ping"}, timestamp=int(time.time()) - 120))
    assert e["code"] == "stale_timestamp" and re.search(r"is 1[12]\d s old", e["message"]), e
    # An unpaired client.
    e = refusal(signed(secrets.token_hex(16), secret, {"what": "check"}))
    assert e["code"] == "unpaired" and "not paired" in e["message"] and "nodes add" in e["hint"]
    agent.wait_for(r"refused a request from 127\.0\.0\.1: this client is not paired")
    # And after all that, a fresh request still passes.
    assert "body" in exchange(setup.port, signed(client_id, secret, {"what": "ping"}))


def test_a_node_lacking_the_clients_isa_is_refused_with_the_reason(setup):
    if os.environ.get("TESSERA_CPU_ADAM_ISA") == "scalar":
        pytest.skip("the client's CPU Adam is capped at scalar: it needs no ISA")
    # Test-only: the agent reports a CPU with SSE4.2 and AVX only, and another Tessera version.
    agent = setup.start_agent(env={"TESSERA_AGENT_TEST_CPU_ISA": "sse4_2,avx",
                                   "TESSERA_AGENT_TEST_TESSERA_VERSION": "0.0.1-test"})
    pair(setup, agent)
    result = setup.cli("nodes", "check", "test-node", "--json", "--no-link", "--need-ram", str(1 << 50))
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    checks = {c["name"]: c for c in report["checks"]}
    isa = checks["cpu isa"]
    if not isa["measured"]["required"]:
        pytest.skip("this machine's CPU Adam runs the scalar kernel: nothing to require")
    assert not isa["ok"]
    assert "lacks" in isa["reason"] and "CPU Adam kernel" in isa["reason"]
    assert all(f in isa["reason"] for f in isa["measured"]["required"])
    assert "TESSERA_CPU_ADAM_ISA=scalar" in isa["hint"] and "test override" in isa["detail"]
    version = checks["tessera version"]
    assert not version["ok"] and "0.0.1-test" in version["reason"] and "install" in version["hint"]
    ram = checks["free ram"]
    assert not ram["ok"] and "RAM available, the job needs" in ram["reason"], ram
    assert ram["measured"]["needed"] == 1 << 50
    assert checks["libtorch version"]["ok"] and checks["free disk"]["ok"]
    human = setup.cli("nodes", "check", "test-node", "--no-link")
    assert human.returncode == 1
    assert "FAIL cpu isa" in human.stdout and "what to do: set TESSERA_CPU_ADAM_ISA" in human.stdout
