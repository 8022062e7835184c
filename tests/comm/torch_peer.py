#!/usr/bin/env python3
"""A real PyTorch peer of the weight plane, for the interop tests (docs/operations.md,
"Interoperability with PyTorch peers").

It creates the weight-update group exactly the way slime's trainer and SGLang's
/init_weights_update_group do (sglang/srt/utils.py, init_custom_process_group):

    store, rank, world = next(rendezvous("tcp://ADDR:PORT", rank, world, timeout=...))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg = _new_process_group_helper(world, rank, [], Backend(backend), store,
                                   group_name=group_name, timeout=timeout, <options>=None)

adapted only where torch versions differ in spelling (the options keyword is pg_options before
2.6 and backend_options after; the helper returns (pg, store) since 2.0 and pg before; the rank
map is _world.pg_group_ranks since 2.0 and _pg_group_ranks before), and moves tensors with
torch.distributed.broadcast(t, src=0, group=pg), one call per tensor, as both sides do.

Modes:
  trainer  plays slime's trainer (group rank 0) against a real engine server: reads the
           engine's checkpoint (model.safetensors), perturbs every tensor (seeded), writes the
           perturbed checkpoint to --out (config and tokenizer copied), then POSTs
           /init_weights_update_group while joining the group itself, and per bucket POSTs
           /update_weights_from_distributed (names, dtypes, shapes, group_name, flush_cache,
           weight_version) while broadcasting that bucket's tensors. The q/k/v projections go
           in separate buckets (separate calls). Checks /get_weight_version and
           /get_weights_by_name afterwards, then destroys the group.
  engine   plays an SGLang engine (group ranks rank_offset..): an HTTP server on 127.0.0.1
           (port 0; "PORT <n>" on stdout and in --port-file) answering
           /init_weights_update_group, /update_weights_from_distributed and
           /destroy_weights_update_group like SGLang; every received tensor's raw bytes go to
           --dump-dir/<index>.bin, listed in --dump-dir/received.json. Exits after
           /destroy_weights_update_group or --deadline seconds.
  colocated plays slime's colocated trainer against a real engine server: the same perturbed
           checkpoint, sent as SGLang's flattened buckets (uint8 form, dtypes mixed, q/k/v
           apart, one empty bucket) pickled by torch's ForkingPickler and base64-encoded, one
           POST /update_weights_from_tensor per bucket (load_format "flattened_bucket", one entry
           per engine TP rank). --device cpu shares CPU tensors by torch's "file_system"
           strategy; --device cuda sends CUDA IPC handles with SGLang's device-UUID patch and
           checks that the engine releases each block (the producer's reference count goes
           1 -> 0). A bucket whose metadata overruns it must be refused with a 400.
  selftest trainer and engine in two processes of this interpreter (no slime-cpp involved).

Every wait is bounded (--timeout for the group, --deadline for the whole run): a peer that
does not show up makes this exit non-zero with a message instead of hanging.
Only the standard library and torch are used (no safetensors package: Debian 12 has none).
"""

import argparse
import inspect
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import http.client
import urllib.error
import urllib.parse
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.distributed as dist

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
SAFETENSORS_NAME = {v: k for k, v in DTYPES.items()}


def log(msg):
    print(f"torch_peer[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def dtype_from_name(name):
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# ---- the group, created as slime's trainer and SGLang create it

def init_custom_process_group(backend, init_method, timeout, world_size, rank, group_name):
    from torch.distributed import distributed_c10d as c10d

    store, rank, world_size = next(
        c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    params = inspect.signature(c10d._new_process_group_helper).parameters
    options_kw = "backend_options" if "backend_options" in params else "pg_options"
    pg = c10d._new_process_group_helper(
        world_size, rank, [], c10d.Backend(backend), store,
        group_name=group_name, timeout=timeout, **{options_kw: None})
    if isinstance(pg, tuple):  # torch >= 2.0 returns (pg, prefix_store)
        pg = pg[0]
    ranks = {i: i for i in range(world_size)}
    if hasattr(c10d, "_world"):
        c10d._world.pg_group_ranks[pg] = ranks
    else:
        c10d._pg_group_ranks[pg] = ranks
    return pg


def destroy_group(pg):
    try:
        dist.destroy_process_group(pg)
    except Exception as e:  # older torch: the custom group is not fully registered
        log(f"destroy_process_group: {e}")


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


# ---- safetensors, read and written with the standard library

def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtype).reshape(info["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": SAFETENSORS_NAME[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- HTTP

def http_call(method, url, body=None, timeout=60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Call:
    """An HTTP call whose request is on the wire when the constructor returns; get() collects
    the reply. The trainer sends, then enters c10d (whose TCPStore constructor may hold the GIL
    while it waits for the peers, so a helper thread could not send meanwhile), then collects."""

    def __init__(self, method, url, body, timeout):
        u = urllib.parse.urlparse(url)
        self.timeout = timeout
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        self.conn.request(method, u.path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json"})

    def get(self, what):
        try:
            r = self.conn.getresponse()
            status, body = r.status, json.loads(r.read() or b"null")
        except Exception as e:
            raise SystemExit(f"{what}: no reply within {self.timeout} s ({type(e).__name__}: {e})")
        finally:
            self.conn.close()
        if status != 200 or not (isinstance(body, dict) and body.get("success")):
            raise SystemExit(f"{what}: HTTP {status}: {body}")
        return body


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- trainer (group rank 0)

def bucket_plan(names):
    """q_proj, k_proj and v_proj in separate buckets (separate update calls), the rest after."""
    qs = [n for n in names if ".q_proj." in n]
    ks = [n for n in names if ".k_proj." in n]
    vs = [n for n in names if ".v_proj." in n]
    rest = [n for n in names if n not in set(qs + ks + vs)]
    buckets = [b for b in (qs, rest[: len(rest) // 2], ks, vs, rest[len(rest) // 2:]) if b]
    return buckets


def perturb(tensors, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in sorted(tensors.items()):
        if t.is_floating_point():
            noise = torch.randn(t.shape, generator=g, dtype=torch.float32) * 0.05
            out[name] = (t.to(torch.float32) + noise).to(dtype)
        else:
            out[name] = t.clone()
    return out


def perturbed_checkpoint(a, base):
    """The engine's checkpoint with every tensor perturbed (seeded), in the engine's dtype,
    written to --out (config and tokenizer copied): what the update will send."""
    status, info = http_call("GET", base + "/weights_checksum", timeout=a.timeout)
    if status != 200:
        raise SystemExit(f"GET /weights_checksum: HTTP {status}: {info}")
    dtype = dtype_from_name(info["dtype"])
    original = {}
    for f in sorted(os.listdir(a.checkpoint)):  # model.safetensors or its shards
        if f.endswith(".safetensors"):
            original.update(read_safetensors(os.path.join(a.checkpoint, f)))
    weights = perturb(original, dtype, a.seed)
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.checkpoint):
        src = os.path.join(a.checkpoint, f)
        if os.path.isfile(src) and not f.endswith(".safetensors") and "safetensors.index" not in f:
            shutil.copy(src, os.path.join(a.out, f))
    write_safetensors(os.path.join(a.out, "model.safetensors"), weights)
    log(f"wrote the perturbed checkpoint ({len(weights)} tensors, {dtype}) to {a.out}")
    return weights


def check_engine_holds(a, base, weights):
    status, got = http_call("GET", base + "/get_weight_version", timeout=a.timeout)
    if status != 200 or got.get("weight_version") != a.weight_version:
        raise SystemExit(f"/get_weight_version: HTTP {status}: {got} (want {a.weight_version!r})")
    probe = next(n for n in weights if n.endswith("q_proj.weight"))
    status, got = http_call("POST", base + "/get_weights_by_name",
                            {"name": probe, "truncate_size": 3}, timeout=a.timeout)
    want = weights[probe].to(torch.float32).numpy().tolist()[:3]
    if status != 200 or got != want:
        raise SystemExit(f"/get_weights_by_name {probe}: HTTP {status}: {str(got)[:300]} "
                         f"(want {str(want)[:300]})")


def run_trainer(a):
    base = a.engine_url.rstrip("/")
    weights = perturbed_checkpoint(a, base)

    port = a.master_port or free_port()
    timeout = timedelta(seconds=a.timeout)
    init = Call("POST", base + "/init_weights_update_group", {
        "master_address": a.master_address, "master_port": port, "rank_offset": 1,
        "world_size": a.world_size, "group_name": a.group_name, "backend": a.backend,
    }, a.timeout)
    pg = init_custom_process_group(a.backend, f"tcp://{a.master_address}:{port}", timeout,
                                   a.world_size, 0, a.group_name)
    init.get("/init_weights_update_group")
    log(f"group {a.group_name!r} ({a.backend}, world {a.world_size}) joined on port {port}")

    device = torch.device("cuda" if a.backend == "nccl" else "cpu")
    buckets = bucket_plan(list(weights))
    for i, names in enumerate(buckets):
        tensors = [weights[n].to(device).contiguous() for n in names]
        call = Call("POST", base + "/update_weights_from_distributed", {
            "names": names, "dtypes": [dtype_name(t.dtype) for t in tensors],
            "shapes": [list(t.shape) for t in tensors], "group_name": a.group_name,
            "flush_cache": True, "weight_version": a.weight_version,
        }, a.timeout)
        for t in tensors:
            dist.broadcast(t, src=0, group=pg)
        call.get(f"/update_weights_from_distributed bucket {i} ({names[0]} ...)")
    log(f"sent {len(weights)} tensors in {len(buckets)} buckets")

    check_engine_holds(a, base, weights)
    c = Call("POST", base + "/destroy_weights_update_group", {"group_name": a.group_name},
             a.timeout)
    c.get("/destroy_weights_update_group")
    destroy_group(pg)
    print(json.dumps({"ok": True, "tensors": len(weights), "buckets": len(buckets),
                      "port": port, "torch": torch.__version__}), flush=True)


# ---- colocated trainer: SGLang's flattened buckets over /update_weights_from_tensor

def sglang_module(name):
    """An (empty) module registered under SGLang's dotted name, so that what we define in it is
    pickled by reference under the same global name SGLang's own objects carry."""
    import types
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    return sys.modules[name]


def define_sglang_objects(patch_device_uuid):
    """FlattenedTensorMetadata as SGLang defines it (sglang.srt.weight_sync.tensor_bucket), and,
    for CUDA, SGLang's change to torch's tensor reduction (sglang.srt.utils.patch_torch): the
    device index (argument 6 of rebuild_cuda_tensor) travels as the GPU's UUID string."""
    import dataclasses
    from torch.multiprocessing import reductions

    bucket_module = sglang_module("sglang.srt.weight_sync.tensor_bucket")

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    FlattenedTensorMetadata.__module__ = bucket_module.__name__
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    bucket_module.FlattenedTensorMetadata = FlattenedTensorMetadata

    if patch_device_uuid and not hasattr(reductions, "_slime_test_original_reduce"):
        patch = sglang_module("sglang.srt.utils.patch_torch")
        original_reduce, original_rebuild = reductions.reduce_tensor, reductions.rebuild_cuda_tensor

        def _rebuild_cuda_tensor_modified(*args):  # the receiving side, unused here
            return original_rebuild(*args)

        def reduce_with_uuid(tensor):
            fn, args = original_reduce(tensor)
            if len(args) > 6 and isinstance(args[6], int):
                args = (*args[:6], str(torch.cuda.get_device_properties(args[6]).uuid), *args[7:])
            if len(args) == 15 and args[11] is not None:  # each pickling takes a new counter slot
                SENT_REF_COUNTERS.append((args[11], args[12]))
            return fn, args

        _rebuild_cuda_tensor_modified.__module__ = patch.__name__
        _rebuild_cuda_tensor_modified.__qualname__ = "_rebuild_cuda_tensor_modified"
        patch._rebuild_cuda_tensor_modified = _rebuild_cuda_tensor_modified
        reductions._slime_test_original_reduce = original_reduce
        reductions.rebuild_cuda_tensor = _rebuild_cuda_tensor_modified
        reductions.reduce_tensor = reduce_with_uuid
        reductions.init_reductions()
    return FlattenedTensorMetadata


def flattened_bucket(named, device, metadata_cls):
    """SGLang's FlattenedTensorBucket: every tensor's bytes in one uint8 tensor (dtypes may mix),
    with (name, shape, dtype, start_idx, end_idx, numel) in bytes per tensor."""
    parts, metadata, at = [], [], 0
    for name, t in named:
        flat = t.to(device).contiguous().reshape(-1).view(torch.uint8)
        metadata.append(metadata_cls(name, t.shape, t.dtype, at, at + flat.numel(), flat.numel()))
        parts.append(flat)
        at += flat.numel()
    flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
    return {"flattened_tensor": flat, "metadata": metadata}


def serialize(obj):
    """SGLang's MultiprocessingSerializer.serialize(obj, output_str=True)."""
    import base64
    import io
    from multiprocessing.reduction import ForkingPickler
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode("utf-8")


# (ref-counter file, slot) of every CUDA tensor pickled, in order (reduce_with_uuid records them:
# torch gives each pickling of a CUDA storage a fresh counter slot set to 1).
SENT_REF_COUNTERS = []


def cuda_ref_count(handle, offset):
    """A slot of the producer's CUDA IPC reference counters (torch's shared-memory counter file:
    a 64-byte header, then int64 slots)."""
    with open("/dev/shm/" + handle.decode().lstrip("/"), "rb") as f:
        f.seek(64 + 8 * offset)
        return struct.unpack("<q", f.read(8))[0]


def run_colocated(a):
    base = a.engine_url.rstrip("/")
    weights = perturbed_checkpoint(a, base)
    cuda = a.device == "cuda"
    if not cuda:
        # A CPU tensor crosses HTTP only as a named shared-memory file (torch's default shares
        # a file descriptor, which needs a live connection to this process).
        torch.multiprocessing.set_sharing_strategy("file_system")
    metadata_cls = define_sglang_objects(patch_device_uuid=cuda)
    device = torch.device(a.device)
    buckets = bucket_plan(list(weights))
    # Mixed dtypes in one bucket, as SGLang's uint8 form allows: the norms go in a wider float
    # dtype than the engine's (exact), which the engine converts on copy as SGLang's loader does.
    engine_dtype = next(iter(weights.values())).dtype
    wider = torch.float64 if engine_dtype == torch.float32 else torch.float32
    named_buckets = [[(n, weights[n].to(wider) if "norm" in n else weights[n])
                      for n in names] for names in buckets]
    named_buckets.insert(1, [])  # an empty bucket, as a rank with nothing to send posts
    released = []
    for i, named in enumerate(named_buckets):
        data = flattened_bucket(named, device, metadata_cls)
        # One entry per engine TP rank (each rank's GPU holds its own copy in slime; on the
        # CPU the ranks share one shared-memory file).
        del SENT_REF_COUNTERS[:]
        entries = [serialize(data)] * (a.world_size - 1)
        body = {"serialized_named_tensors": entries, "load_format": "flattened_bucket",
                "flush_cache": False, "weight_version": a.weight_version}
        slot = SENT_REF_COUNTERS[0] if cuda and named else None
        refs_before = cuda_ref_count(*slot) if slot else None
        status, got = http_call("POST", base + "/update_weights_from_tensor", body, a.timeout)
        if status != 200 or not (isinstance(got, dict) and got.get("success")):
            raise SystemExit(f"/update_weights_from_tensor bucket {i}: HTTP {status}: {got}")
        if refs_before is not None:
            refs_after = cuda_ref_count(*slot)
            if (refs_before, refs_after) != (1, 0):
                raise SystemExit(f"bucket {i}: the CUDA IPC reference count went {refs_before} "
                                 f"-> {refs_after} (want 1 -> 0: the engine releases the block)")
            released.append(i)
        del data
        if cuda:
            torch.cuda.ipc_collect()
    # A bad bucket is refused whole: metadata past the end of the flattened tensor.
    bad = flattened_bucket([("model.norm.weight", weights["model.norm.weight"])], device,
                           metadata_cls)
    bad["metadata"][0].end_idx += 4
    bad["metadata"][0].numel += 4
    status, got = http_call("POST", base + "/update_weights_from_tensor", {
        "serialized_named_tensors": [serialize(bad)] * (a.world_size - 1),
        "load_format": "flattened_bucket"},
        a.timeout)
    message = json.dumps(got)
    if status != 400 or "metadata[0]" not in message:
        raise SystemExit(f"a bucket whose metadata overruns it: HTTP {status}: {message} "
                         "(want 400 naming metadata[0])")
    check_engine_holds(a, base, weights)
    print(json.dumps({"ok": True, "tensors": len(weights), "buckets": len(named_buckets),
                      "released": released, "torch": torch.__version__}), flush=True)


# ---- engine (group ranks rank_offset ..), SGLang's HTTP surface for the weight plane

class EngineState:
    def __init__(self, a):
        self.a = a
        self.groups = {}
        self.received = []  # [{"name", "dtype", "shape", "file"}]
        self.version = "default"
        self.done = threading.Event()
        self.lock = threading.Lock()


def make_handler(state):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            log("http: " + fmt % args)

        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            if self.path == "/get_weight_version":
                return self.reply(200, {"weight_version": state.version})
            if self.path == "/health":
                return self.reply(200, {})
            self.reply(404, {"success": False, "message": f"no route {self.path}"})

        def do_POST(self):
            try:
                b = self.body()
                with state.lock:  # one weight-plane call at a time, in arrival order
                    if self.path == "/init_weights_update_group":
                        return self.init(b)
                    if self.path == "/update_weights_from_distributed":
                        return self.update(b)
                    if self.path == "/destroy_weights_update_group":
                        name = b.get("group_name", "weight_update_group")
                        destroy_group(state.groups.pop(name))
                        self.reply(200, {"success": True, "message": "destroyed"})
                        state.done.set()
                        return None
                self.reply(404, {"success": False, "message": f"no route {self.path}"})
            except Exception as e:  # the message goes back to the caller, as SGLang does
                log(f"{self.path}: {type(e).__name__}: {e}")
                self.reply(400, {"success": False, "message": f"{type(e).__name__}: {e}"})
            return None

        def init(self, b):
            a = state.a
            rank = b["rank_offset"]  # this peer takes one rank (one "GPU")
            pg = init_custom_process_group(
                b.get("backend", "nccl"),
                f"tcp://{b['master_address']}:{b['master_port']}",
                timedelta(seconds=a.timeout), b["world_size"], rank,
                b.get("group_name", "weight_update_group"))
            state.groups[b.get("group_name", "weight_update_group")] = pg
            log(f"joined group {b.get('group_name')!r} as rank {rank} of {b['world_size']}")
            self.reply(200, {"success": True,
                             "message": "Succeeded to initialize custom process group."})

        def update(self, b):
            pg = state.groups[b.get("group_name", "weight_update_group")]
            device = torch.device("cuda" if torch.cuda.is_available() and
                                  dist.get_backend(pg) == "nccl" else "cpu")
            for name, dt, shape in zip(b["names"], b["dtypes"], b["shapes"]):
                t = torch.empty(shape, dtype=dtype_from_name(dt), device=device)
                dist.broadcast(t, src=0, group=pg)
                i = len(state.received)
                path = os.path.join(state.a.dump_dir, f"{i}.bin")
                with open(path, "wb") as f:
                    f.write(tensor_bytes(t))
                state.received.append({"name": name, "dtype": dt, "shape": shape,
                                       "file": f"{i}.bin"})
            if b.get("weight_version") is not None:
                state.version = b["weight_version"]
            with open(os.path.join(state.a.dump_dir, "received.json"), "w") as f:
                json.dump({"weight_version": state.version, "tensors": state.received}, f)
            self.reply(200, {"success": True, "message": "Succeeded to update parameter online."})

    return Handler


def run_engine(a):
    os.makedirs(a.dump_dir, exist_ok=True)
    state = EngineState(a)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(state))
    port = server.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, a.port_file)
    print(f"PORT {port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if not state.done.wait(a.deadline):
        raise SystemExit(f"engine: no /destroy_weights_update_group within {a.deadline} s")
    server.shutdown()
    print(json.dumps({"ok": True, "received": len(state.received)}), flush=True)


# ---- selftest: this interpreter on both sides

def run_selftest(a):
    import tempfile
    tmp = tempfile.mkdtemp(prefix="torch_peer_selftest_")
    try:
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        g = torch.Generator().manual_seed(0)
        names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"] + [
            "model.embed_tokens.weight", "model.norm.weight"]
        write_safetensors(os.path.join(ckpt, "model.safetensors"),
                          {n: torch.randn(8, 4, generator=g) for n in names})
        with open(os.path.join(ckpt, "config.json"), "w") as f:
            f.write("{}")
        port_file = os.path.join(tmp, "port")
        engine = subprocess.Popen([sys.executable, __file__, "engine", "--dump-dir",
                                   os.path.join(tmp, "dump"), "--port-file", port_file,
                                   "--timeout", str(a.timeout), "--deadline", str(a.deadline)])
        try:
            deadline = time.time() + 30
            while not os.path.exists(port_file) and time.time() < deadline:
                time.sleep(0.05)
            port = int(open(port_file).read())
            # The fake engine has no /weights_checksum: the trainer is given the dtype below.
            global http_call
            real_http = http_call

            def http_with_checksum(method, url, body=None, timeout=60.0):
                if url.endswith("/weights_checksum"):
                    return 200, {"dtype": "float32"}
                if url.endswith("/get_weights_by_name"):
                    t = read_safetensors(os.path.join(tmp, "out", "model.safetensors"))[body["name"]]
                    return 200, t.to(torch.float32).numpy().tolist()[:body["truncate_size"]]
                return real_http(method, url, body, timeout)
            http_call = http_with_checksum
            a.engine_url = f"http://127.0.0.1:{port}"
            a.checkpoint, a.out = ckpt, os.path.join(tmp, "out")
            run_trainer(a)
            code = engine.wait(a.timeout)
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
        if code != 0:
            raise SystemExit(f"selftest: engine exited with {code}")
        received = json.load(open(os.path.join(tmp, "dump", "received.json")))
        sent = read_safetensors(os.path.join(tmp, "out", "model.safetensors"))
        for r in received["tensors"]:
            got = open(os.path.join(tmp, "dump", r["file"]), "rb").read()
            if got != tensor_bytes(sent[r["name"]]):
                raise SystemExit(f"selftest: {r['name']} differs")
        if len(received["tensors"]) != len(sent):
            raise SystemExit(f"selftest: received {len(received['tensors'])} of {len(sent)}")
        print(json.dumps({"selftest": "ok", "tensors": len(sent), "torch": torch.__version__}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["trainer", "colocated", "engine", "selftest"])
    p.add_argument("--engine-url", help="trainer: the engine server, http://HOST:PORT")
    p.add_argument("--checkpoint", help="trainer: the engine's model directory")
    p.add_argument("--out", help="trainer: where the perturbed checkpoint goes")
    p.add_argument("--master-address", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=0, help="trainer: 0 = a free port")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--group-name", default="weight_update_group")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--device", default="cpu", help="colocated: where the buckets live (cpu, cuda)")
    p.add_argument("--weight-version", default="torch-peer-1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dump-dir", help="engine: where received tensors go")
    p.add_argument("--port", type=int, default=0, help="engine: HTTP port (0 = any)")
    p.add_argument("--port-file", help="engine: write the HTTP port here")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="group rendezvous / collectives and each HTTP call, seconds")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="the whole run, seconds (then exit non-zero)")
    a = p.parse_args()

    def expired(*_):
        log(f"deadline of {a.deadline} s passed in mode {a.mode}; exiting")
        os._exit(3)
    signal.signal(signal.SIGALRM, expired)
    signal.alarm(int(a.deadline) + 5)
    if a.mode in ("trainer", "colocated"):
        for k in ("engine_url", "checkpoint", "out"):
            if not getattr(a, k):
                p.error(f"{a.mode} needs --{k.replace('_', '-')}")
        run_trainer(a) if a.mode == "trainer" else run_colocated(a)
    elif a.mode == "engine":
        if not a.dump_dir:
            p.error("engine needs --dump-dir")
        run_engine(a)
    else:
        run_selftest(a)
    sys.stdout.flush()
    os._exit(0)  # skip torch's teardown of half-registered groups


if __name__ == "__main__":
    main()
