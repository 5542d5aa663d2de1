#!/usr/bin/env python3
"""bench_planes: which pre-transform makes zstd -1 store an Adam state
smallest (issue 12, item 3: "try bitshuffle and split exponent/mantissa
planes, keep what wins at the same speed").

    /usr/bin/python3 benchmarks/bench_planes.py [--mib 256] [--level 1]

The data is bench_persist.py's: an MLP trained with Adam on CPU, saved as
fp32 weights, both Adam moments and a bf16 copy of the weights.  Each
tensor is cut into 4 MiB chunks (libckpt's default) and every chunk is
compressed alone with the system libzstd at the given level, after one of:

  none      the bytes as they are
  byte      byte shuffle by element width (libckpt's codec today)
  bit       bitshuffle: one plane per bit of the element (as the bitshuffle
            filter does, before zstd instead of lz4)
  expmant   fp32: the 8 exponent bits as one byte plane, then sign+mantissa
            (24 bits) byte-shuffled into 3 planes; bf16: exponent plane +
            one sign+mantissa plane

It prints stored/raw per kind of tensor and in total, and the seconds zstd
spent compressing and decompressing each variant (the transforms here run
in numpy and are not timed: only a variant that stores clearly less would
be worth a C implementation, which costs about what byte shuffle does).
"""

import argparse
import ctypes
import ctypes.util
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CHUNK = 4 << 20

_z = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
_z.ZSTD_compressBound.restype = ctypes.c_size_t
_z.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
_z.ZSTD_compress.restype = ctypes.c_size_t
_z.ZSTD_compress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_int]
_z.ZSTD_decompress.restype = ctypes.c_size_t
_z.ZSTD_decompress.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_size_t]
_z.ZSTD_isError.restype = ctypes.c_uint
_z.ZSTD_isError.argtypes = [ctypes.c_size_t]


def zstd(buf, level, scratch, back):
    """(stored bytes, compress s, decompress s) of one contiguous buffer;
    the round trip is checked."""
    src = np.ascontiguousarray(buf).view(np.uint8).reshape(-1)
    t0 = time.perf_counter()
    n = _z.ZSTD_compress(scratch.ctypes.data, scratch.nbytes, src.ctypes.data,
                         src.nbytes, level)
    t1 = time.perf_counter()
    if _z.ZSTD_isError(n):
        raise RuntimeError("ZSTD_compress failed")
    m = _z.ZSTD_decompress(back.ctypes.data, src.nbytes, scratch.ctypes.data, n)
    t2 = time.perf_counter()
    if _z.ZSTD_isError(m) or m != src.nbytes or not np.array_equal(back[:m], src):
        raise RuntimeError("zstd round trip failed")
    return n, t1 - t0, t2 - t1


def byte_planes(u8, width):
    return u8.reshape(-1, width).T.copy()


def bit_planes(u8, width):
    # (elements, width bytes) -> (width*8 bit planes, elements/8 bytes)
    b = u8.reshape(-1, width)
    bits = np.unpackbits(b, axis=1, bitorder="little")  # (n, width*8)
    return np.packbits(bits.T, axis=1, bitorder="little")


def expmant_planes(u8, width):
    if width == 4:
        x = u8.view(np.uint32)
        exp = ((x >> 23) & 0xFF).astype(np.uint8)
        sm = (x & 0x7FFFFF) | ((x >> 31) << 23)  # sign above the mantissa
        rest = sm.view(np.uint8).reshape(-1, 4)[:, :3].T.copy()
        return [exp, rest]
    x = u8.view(np.uint16)  # bf16
    exp = ((x >> 7) & 0xFF).astype(np.uint8)
    sm = ((x & 0x7F) | ((x >> 15) << 7)).astype(np.uint8)
    return [exp, sm]


VARIANTS = {
    "none": lambda u8, w: [u8],
    "byte": lambda u8, w: [byte_planes(u8, w)],
    "bit": lambda u8, w: [bit_planes(u8, w)],
    "expmant": expmant_planes,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--level", type=int, default=1)
    a = ap.parse_args()
    import torch
    from bench_persist import adam_state
    torch.set_num_threads(os.cpu_count() or 1)
    state = adam_state(torch, a.mib << 20, seed=1)
    scratch = np.empty(_z.ZSTD_compressBound(CHUNK) + 4096, np.uint8)
    back = np.empty(CHUNK, np.uint8)
    # kind -> variant -> [raw, stored, compress s, decompress s]
    tot = {}
    for name, t in state.items():
        kind = name.split(".")[0] + (".exp_avg_sq" if name.endswith("exp_avg_sq") else
                                     ".exp_avg" if name.endswith("exp_avg") else "")
        width = t.element_size()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).contiguous()
        u8 = raw.numpy().view(np.uint8).reshape(-1)
        for off in range(0, u8.nbytes, CHUNK):
            chunk = u8[off:off + CHUNK]
            for v, fn in VARIANTS.items():
                row = tot.setdefault(kind, {}).setdefault(v, [0, 0, 0.0, 0.0])
                row[0] += chunk.nbytes
                for plane in fn(chunk, width):
                    n, c, d = zstd(plane, a.level, scratch, back)
                    row[1] += n
                    row[2] += c
                    row[3] += d
    print("| tensors | raw MiB | " + " | ".join("%s stored/raw" % v for v in VARIANTS) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in VARIANTS) + " |")
    all_ = {v: [0, 0, 0.0, 0.0] for v in VARIANTS}
    for kind, row in sorted(tot.items()):
        for v in VARIANTS:
            for i in range(4):
                all_[v][i] += row[v][i]
        print("| %s | %.0f | %s |" % (kind, row["none"][0] / 2**20, " | ".join(
            "%.3f" % (row[v][1] / row[v][0]) for v in VARIANTS)))
    print("| **all** | %.0f | %s |" % (all_["none"][0] / 2**20, " | ".join(
        "**%.3f**" % (all_[v][1] / all_[v][0]) for v in VARIANTS)))
    print()
    print("| zstd -%d, 1 thread | %s |" % (a.level, " | ".join(VARIANTS)))
    print("| --- | %s |" % " | ".join("---:" for _ in VARIANTS))
    print("| compress s | %s |" % " | ".join("%.3f" % all_[v][2] for v in VARIANTS))
    print("| decompress s | %s |" % " | ".join("%.3f" % all_[v][3] for v in VARIANTS))


if __name__ == "__main__":
    main()
