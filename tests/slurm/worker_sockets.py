#!/usr/bin/env python3
"""Which addresses a job's worker processes listen on and dial (tests/slurm/multinode_train_test.sh).

  worker_sockets.py watch OUT.json PID=ADDR [PID=ADDR ...]
      Samples every 50 ms, until none of the PIDs is alive, the TCP sockets of their child
      processes (the workers a node agent, or the driver's in-process agent, started): the
      listening ones and the established connections, from /proc/<pid>/fd and /proc/net/tcp{,6}.
      PID is a node agent's process (or the driver), ADDR the address that node is bound to.
      Writes what it saw to OUT.json when it stops.
  worker_sockets.py check OUT.json [--min-workers N]
      Prints one line per violation and exits 1 when there is one:
        - a worker listens on an address other than its node's (or all interfaces), e.g. on
          127.0.0.1;
        - a worker holds a listening socket of its parent (the agent, or the driver on node 0),
          i.e. a file descriptor it inherited;
        - a worker connection has 127.0.0.1 at both ends, i.e. someone dialed 127.0.0.1;
      and when the samples prove nothing: fewer than N workers seen, a worker never seen
      listening on its node's address, or no connection between workers of different nodes.

On one host every 127.x address is local, so a job whose processes dial 127.0.0.1 where they
should dial a node's address still works; this is what tells the two apart.
"""
import json
import os
import socket
import sys
import time

TCP_LISTEN, TCP_ESTABLISHED = "0A", "01"


def parse_addr(text):
    """'0100007F:1F90' or a tcp6 address -> ('127.0.0.1', 8080); wildcards -> '*'."""
    hex_ip, hex_port = text.split(":")
    raw = bytes.fromhex(hex_ip)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) byte order.
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        raw = raw[12:]  # ::ffff:a.b.c.d
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw)
        ip = "*" if ip == "0.0.0.0" else ip
    else:
        ip = socket.inet_ntop(socket.AF_INET6, raw)
        ip = "*" if ip == "::" else ip
    return ip, int(hex_port, 16)


def tcp_table():
    table = {}  # inode -> (state, local, remote)
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    table[fields[9]] = (fields[3], parse_addr(fields[1]), parse_addr(fields[2]))
        except OSError:
            pass
    return table


def children_of(parents):
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid in parents:
            found[int(entry)] = ppid
    return found


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def fmt(endpoint):
    return f"{endpoint[0]}:{endpoint[1]}"


def watch(out, specs):
    parents = {}
    for spec in specs:
        pid, addr = spec.split("=", 1)
        parents[int(pid)] = addr
    workers = {}  # pid -> {"node": addr, "listen": set, "conns": set, "inherited": set}
    samples = 0
    while any(alive(p) for p in parents):
        table = tcp_table()
        parent_inodes = {p: socket_inodes(p) for p in parents}
        for pid, ppid in children_of(parents).items():
            w = workers.setdefault(pid, {"node": parents[ppid], "listen": set(), "conns": set(),
                                         "inherited": set()})
            for inode in socket_inodes(pid):
                if inode not in table:
                    continue
                state, local, remote = table[inode]
                if state == TCP_LISTEN:
                    w["listen"].add(fmt(local))
                    if inode in parent_inodes[ppid]:
                        w["inherited"].add(fmt(local))
                elif state == TCP_ESTABLISHED:
                    w["conns"].add((fmt(local), fmt(remote)))
        samples += 1
        time.sleep(0.05)
    result = {"samples": samples,
              "workers": {str(pid): {"node": w["node"], "listen": sorted(w["listen"]),
                                     "conns": sorted(w["conns"]),
                                     "inherited": sorted(w["inherited"])}
                          for pid, w in workers.items()}}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def check(path, min_workers):
    with open(path) as f:
        data = json.load(f)
    workers = data["workers"]
    problems = []
    if len(workers) < min_workers:
        problems.append(f"only {len(workers)} worker process(es) seen in {data['samples']} "
                        f"samples, expected at least {min_workers}")
    owner = {}  # (local, remote) -> pid
    for pid, w in workers.items():
        for local, remote in w["conns"]:
            owner[(local, remote)] = pid
    cross_node = []
    for pid, w in workers.items():
        node = w["node"]
        listen_hosts = [a.rsplit(":", 1)[0] for a in w["listen"]]
        if node not in listen_hosts:
            problems.append(f"worker pid {pid} (node {node}) was never seen listening on {node}")
        for addr in w["listen"]:
            host = addr.rsplit(":", 1)[0]
            if host not in (node, "*"):
                problems.append(f"worker pid {pid} of node {node} listens on {addr}")
        for addr in w["inherited"]:
            problems.append(f"worker pid {pid} of node {node} holds its parent's listening "
                            f"socket {addr} (an inherited file descriptor)")
        for local, remote in w["conns"]:
            if local.startswith("127.0.0.1:") and remote.startswith("127.0.0.1:"):
                problems.append(f"worker pid {pid} of node {node} has a connection {local} <-> "
                                f"{remote}: someone dialed 127.0.0.1")
            peer = owner.get((remote, local))
            if peer is not None and workers[peer]["node"] != node:
                cross_node.append((pid, peer))
    if not cross_node:
        problems.append("no connection between workers of different nodes was seen")
    for p in problems[:12]:
        print(p)
    if len(problems) > 12:
        print(f"... and {len(problems) - 12} more")
    print(f"worker_sockets: {len(workers)} workers, {data['samples']} samples, "
          f"{len(cross_node)} cross-node worker connection ends, {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "watch":
        watch(argv[2], argv[3:])
        return 0
    if len(argv) >= 3 and argv[1] == "check":
        min_workers = int(argv[4]) if len(argv) >= 5 and argv[3] == "--min-workers" else 1
        return check(argv[2], min_workers)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
