"""Hosts of their own on one machine, for tests/pipelines/test_multihost.py: each host a network namespace
with its own address on a bridge, its own name (a UTS namespace, resolved by every host's /etc/hosts, which
`ip netns exec` mounts from /etc/netns/<ns>/hosts) and its own mount namespace, where it may hide folders of
this machine behind a private tmpfs and mount volumes at their own paths. Needs root, iproute2 and util-linux.

Every process a host runs is in its namespace, so `destroy` finds them all (`ip netns pids`), also the ones
that left their process group (the machine engine's service starts its own session)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")


def unavailable() -> str | None:
    """Why hosts cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network and mount namespaces need root (CI runs as root)"
    missing = [tool for tool in ("ip", "unshare", "mount", "hostname") if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (iproute2, util-linux, hostname: scripts/setup_venv.sh)"
    return None


@dataclass(frozen=True)
class Cluster:
    tag: str  # unique per test process: namespace and link names of concurrent test runs never meet
    subnet: str  # "10.231.N": host i is .i+1, this machine (the test process) is .254 on the bridge
    hosts: tuple[str, ...]

    def ns(self, host: str) -> str:
        return f"pm{self.tag}-{host}"

    def ip(self, host: str) -> str:
        return f"{self.subnet}.{self.hosts.index(host) + 1}"

    def link(self, host: str) -> str:
        """The host's cable: the bridge's end of its veth pair (15 characters at most)."""
        return f"pm{self.tag}v{self.hosts.index(host)}"

    @property
    def bridge(self) -> str:
        return f"pm{self.tag}br"

    def hosts_file(self) -> str:
        return "127.0.0.1 localhost\n" + "".join(f"{self.ip(h)} {h}\n" for h in self.hosts)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def create(hosts: Sequence[str], tag: str | None = None) -> Cluster:
    """The bridge, one namespace per host with its veth, address and hosts file. On failure, what was made goes."""
    tag = tag or str(os.getpid())
    sweep(hosts)
    cluster = Cluster(tag, free_subnet(int(tag) % 250), tuple(hosts))
    destroy(cluster)  # what a killed earlier test process of the same pid may have left
    try:
        _ip("link", "add", cluster.bridge, "type", "bridge")
        _ip("addr", "add", f"{cluster.subnet}.254/24", "dev", cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        for host in hosts:
            ns = cluster.ns(host)
            _ip("netns", "add", ns)
            _ip("link", "add", cluster.link(host), "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", cluster.link(host), "master", cluster.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{cluster.ip(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / ns / "hosts").write_text(cluster.hosts_file())
    except BaseException:
        destroy(cluster)
        raise
    return cluster


def sweep(hosts: Sequence[str]) -> None:
    """Hosts left by test processes that were killed before their teardown (the tag is the creator's pid)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for tag in stale_tags(listed, lambda pid: Path(f"/proc/{pid}").exists()):
        destroy(Cluster(tag, "", tuple(hosts)))


def stale_tags(listing: str, alive: Callable[[str], bool]) -> set[str]:
    """Pure: the tags of `ip netns list`'s pm<pid>-<host> namespaces whose creating process is gone."""
    return {m.group(1) for m in re.finditer(r"^pm(\d+)-\w+", listing, flags=re.M) if not alive(m.group(1))}


def free_subnet(first: int) -> str:
    """A 10.231.N.0/24 no interface of this machine is on (another test process's bridge, say)."""
    for n in (*range(first, 250), *range(first)):
        used = subprocess.run(["ip", "-o", "addr", "show", "to", f"10.231.{n}.0/24"], capture_output=True,
                              text=True, timeout=30)
        if not used.stdout.strip():
            return f"10.231.{n}"
    raise RuntimeError("no free 10.231.N.0/24 subnet")


def processes(cluster: Cluster, host: str) -> list[int]:
    found = subprocess.run(["ip", "netns", "pids", cluster.ns(host)], capture_output=True, text=True, timeout=30)
    return [int(p) for p in found.stdout.split()]


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and of its children it waited for (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def kill_host(cluster: Cluster, host: str) -> float:
    """kill -9 every process the host runs (a host that dies); their CPU seconds (nobody waits for them)."""
    spent = 0.0
    for pid in processes(cluster, host):
        spent += cpu_seconds(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return spent


def destroy(cluster: Cluster) -> float:
    """Kill every process of every host, then remove the namespaces, the bridge and the hosts files; the CPU
    seconds of the processes killed."""
    spent = sum(kill_host(cluster, host) for host in cluster.hosts)
    deadline = time.monotonic() + 30
    while any(processes(cluster, h) for h in cluster.hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    for host in cluster.hosts:
        subprocess.run(["ip", "netns", "del", cluster.ns(host)], capture_output=True, timeout=30)
        shutil.rmtree(NETNS_ETC / cluster.ns(host), ignore_errors=True)
    subprocess.run(["ip", "link", "del", cluster.bridge], capture_output=True, timeout=30)
    return spent


def set_link(cluster: Cluster, host: str, up: bool) -> None:
    """Plug or unplug the host's cable: its packets are dropped, its connections stay open (a switch port down)."""
    _ip("link", "set", cluster.link(host), "up" if up else "down")


def host_script(name: str, hide: Sequence[str], volumes: Sequence[str]) -> str:
    """Pure: the shell lines that make a host of the namespaces `spawn` enters: its name, a private tmpfs over
    each folder of `hide`, then each of `volumes` mounted back at its own path (bound aside first, since it may
    live under a hidden folder), then exec of the command."""
    q = shlex.quote
    lines = [f"hostname {q(name)}", "mount --make-rprivate /"]
    if volumes:
        lines.append("mount -t tmpfs pm-volumes /mnt")
        lines += [f"mkdir /mnt/{i} && mount --bind {q(v)} /mnt/{i}" for i, v in enumerate(volumes)]
    lines += [f"mount -t tmpfs pm-private {q(h)}" for h in hide]
    lines += [f"mkdir -p {q(v)} && mount --bind /mnt/{i} {q(v)}" for i, v in enumerate(volumes)]
    return " && ".join([*lines, 'exec "$@"'])


def spawn(cluster: Cluster, host: str, argv: Sequence[str], env: Mapping[str, str], log: Path,
          hide: Sequence[str] = (), volumes: Sequence[str] = (), cwd: str | None = None) -> subprocess.Popen:
    """Run `argv` on `host` in a new session (so its process group can be killed as one), output to `log`."""
    script = host_script(host, hide, volumes)
    command = ["ip", "netns", "exec", cluster.ns(host), "unshare", "--uts", "--mount", "sh", "-c", script, "sh",
               *argv]
    with open(log, "ab") as out:
        return subprocess.Popen(command, env=dict(env), stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                stdin=subprocess.DEVNULL, start_new_session=True)
