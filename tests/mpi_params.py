"""Compares the trained parameters of two twinkle checkpoints (safetensors,
float32) against the tolerance mpi_train.sh derives from the summation order.

usage: mpi_params.py A.safetensors B.safetensors INIT.safetensors TOL LABEL

Prints max |A - B| and rel = ||A - B|| / ||A - INIT|| (the difference as a
fraction of the training's own update; INIT holds the parameters before the
first step) over every tensor of A; exits 1 when rel > TOL. Pure Python: the
test needs no numpy."""
import array
import json
import math
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit("%s: %s is %s, not F32" % (path, name, t["dtype"]))
        a, b = t["data_offsets"]
        out[name] = array.array("f", raw[8 + n + a:8 + n + b])
    return out


def main():
    a, b, init = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
    tol, label = float(sys.argv[4]), sys.argv[5]
    worst = dd = uu = 0.0
    count = 0
    for name, va in a.items():
        if name not in b or name not in init or len(b[name]) != len(va):
            sys.exit("FAIL %s: tensor %s is missing or differs in size" % (label, name))
        for x, y, z in zip(va, b[name], init[name]):
            d, u = x - y, x - z
            worst = max(worst, abs(d))
            dd += d * d
            uu += u * u
            count += 1
    rel = math.sqrt(dd / uu) if uu > 0 else math.inf
    ok = rel <= tol
    print("%s %s: %d parameters, max|diff| %.3e, ||diff|| / ||update|| = %.3e (tolerance %.3e)"
          % ("ok  " if ok else "FAIL", label, count, worst, rel, tol))
    sys.exit(0 if ok else 1)


main()
