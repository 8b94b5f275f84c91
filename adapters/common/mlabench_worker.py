"""The worker side of mlabench's implementation protocol, version 1
(docs/protocol.md): JSON lines on stdin/stdout, tensors as safetensors files.

A worker subclasses `Implementation` and calls `serve(impl)`. Only numpy is
needed here; GPU adapters bring their own libraries. Anything the worker or
its libraries print goes to stderr: stdout carries protocol lines only.
"""
import json
import os
import struct
import sys
import time
import traceback

import numpy as np

PROTOCOL = 1

# safetensors dtype names <-> numpy storage. bf16 travels as its uint16 bit
# pattern and e4m3 as its bytes: numpy has neither type.
_NP = {"BF16": np.uint16, "F8_E4M3": np.uint8, "F32": np.float32, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path, mmap=True):
    """name -> (dtype name, numpy array) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r") if mmap else np.fromfile(path, dtype=np.uint8)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        arr = raw[base + a:base + b].view(_NP[t["dtype"]]).reshape(t["shape"])
        out[name] = (t["dtype"], arr)
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, numpy array in that dtype's storage)."""
    header, at, blobs = {}, 0, []
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr.astype(_NP[dt], copy=False)).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# Codecs, for workers that compute on the host.
def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as the contract's bf16 outputs are."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = np.isnan(x)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    return r


def _e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 0xF and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = sign * m / 8.0 * 2.0 ** -6
        else:
            t[b] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()


def e4m3_to_f32(b):
    return E4M3[b]


class Refused(Exception):
    """The worker cannot do what was asked; it answers ok=false and stays up."""


class Unsupported(Refused):
    """The library cannot run this case at all (found out at run time): the
    row is a skip with this reason, not an error."""


class Implementation:
    """What a worker implements. `load` receives the inputs of one case (one
    DCP rank for MLA decode) in the contract's layout; `run` returns the
    outputs as numpy arrays in their wire storage (bf16 as uint16 bits);
    `time` returns the samples of the timed call in milliseconds."""

    name = "unnamed"
    version = ""
    contracts = ()

    def device(self):
        return {"name": "host CPU", "kind": "cpu"}

    def capabilities(self):
        return {}

    def load(self, contract, tensors, params, outputs):
        raise NotImplementedError

    def run(self, poison):
        raise NotImplementedError

    def time(self, req):
        """Default: host wall time of `run`, as a CPU worker reports it."""
        for _ in range(int(req.get("warmup", 0))):
            self.run(None)
        samples, total = [], 0.0
        while len(samples) < max(1, int(req.get("min_samples", 1))) or total < float(req.get("min_time_ms", 0)):
            t0 = time.perf_counter()
            self.run(None)
            ms = (time.perf_counter() - t0) * 1e3
            samples.append(ms)
            total += ms
            if len(samples) >= int(req.get("max_samples", 1 << 30)):
                break
        return samples, "cpu-wall"

    def unload(self):
        pass


def poisoned(spec, poison):
    """An output filled with the poison pattern mlabench asked for."""
    dt = spec["dtype"]
    if dt == "BF16":
        return np.full(spec["shape"], poison["bf16"] if poison else 0, dtype=np.uint16)
    if dt == "F32":
        a = np.full(spec["shape"], poison["f32"] if poison else 0, dtype=np.uint32)
        return a.view(np.float32)
    raise Refused(f"output dtype {dt} is not one the contract uses")


def serve(impl, stdin=None, stdout=None):
    """The request loop. Returns when mlabench says bye or closes stdin."""
    proto_out = stdout or os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    if stdout is None:
        # Anything a library prints must not land among protocol lines.
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        sys.stdout = sys.stderr
    src = stdin or sys.stdin
    state = {"dir": None}
    # The raw channel, for tests that must break the protocol on purpose.
    impl.channel = proto_out

    def answer(obj):
        proto_out.write(json.dumps(obj) + "\n")
        proto_out.flush()

    for line in src:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            answer({"ok": False, "error": f"not JSON: {e}"})
            continue
        op = req.get("op")
        try:
            if op == "hello":
                answer({"ok": True, "protocol": PROTOCOL, "name": impl.name, "version": impl.version,
                        "contracts": list(impl.contracts), "device": impl.device(),
                        "capabilities": impl.capabilities()})
            elif op == "load":
                state["dir"] = req["dir"]
                tensors = read_safetensors(os.path.join(req["dir"], req["inputs"]))
                impl.load(req["contract"], tensors, req.get("params", {}), req.get("outputs", []))
                answer({"ok": True})
            elif op == "run":
                outs = impl.run(req.get("poison"))
                path = os.path.join(state["dir"], req["outputs"])
                write_safetensors(path, outs)
                answer({"ok": True, "outputs": req["outputs"]})
            elif op == "time":
                samples, clock = impl.time(req)
                answer({"ok": True, "samples_ms": [float(s) for s in samples], "clock": clock})
            elif op == "unload":
                impl.unload()
                answer({"ok": True})
            elif op == "bye":
                answer({"ok": True})
                return
            else:
                answer({"ok": False, "error": f"unknown op {op!r}"})
        except Unsupported as e:
            answer({"ok": False, "unsupported": True, "error": str(e)})
        except Refused as e:
            answer({"ok": False, "error": str(e)})
        except Exception as e:  # the request failed; the worker stays up
            traceback.print_exc(file=sys.stderr)
            answer({"ok": False, "error": f"{type(e).__name__}: {e}"})
